//! A static token-embedding table distilled from all-MiniLM-L6-v2, Model2Vec-style.
//!
//! Running the encoder costs 25–480 ms per prompt on a CPU (`docs/classification.md`); the
//! request path has microseconds. Distillation moves the encoder's work offline: every vocabulary
//! token was passed through it once, the outputs reduced to 64 dimensions by PCA, weighted by a
//! Zipf estimate of the token's frequency (SIF) and quantised to int8 (`scripts/classify/
//! distill.py`; provenance in `model/README.md`). A prompt's embedding is then the mean of its
//! tokens' rows, L2-normalised: one add of 64 bytes per token.
//!
//! The file (`KSTE0001`, little-endian): 8 bytes of magic, u32 rows, u32 dims, dims f32 scales,
//! then rows × dims int8, row-major in vocabulary order; row `t` dequantises to `q[t] ⊙ scale`.

use std::sync::LazyLock;

/// Dimensions of the compiled-in table (and of every table this build reads).
pub const DIMS: usize = 64;

const MAGIC: &[u8; 8] = b"KSTE0001";

/// The compiled-in table: 30,522 × 64 int8 (1.95 MB).
const MINILM_TABLE: &[u8] = include_bytes!("../model/static-minilm-d64.kste");

static MINILM: LazyLock<StaticEmbedding> = LazyLock::new(|| {
    StaticEmbedding::from_bytes(MINILM_TABLE).expect("the compiled-in static table is valid")
});

/// The table distilled from all-MiniLM-L6-v2, indexed by [`crate::wordpiece::minilm`]'s ids.
pub fn minilm() -> &'static StaticEmbedding {
    &MINILM
}

/// Why a table was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TableError {
    #[error("not a KSTE0001 table")]
    Magic,
    #[error("the table has {0} dimensions; this build reads {DIMS}")]
    Dims(u32),
    #[error("the table's size is {found} bytes; {rows} rows of {DIMS} need {expected}")]
    Size {
        found: usize,
        rows: usize,
        expected: usize,
    },
    #[error("the table holds a scale that is not a positive finite number")]
    Scale,
}

/// One row, aligned to a cache line so that a token costs one line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Row([i8; DIMS]);

/// A quantised static embedding table.
#[derive(Debug)]
pub struct StaticEmbedding {
    rows: Box<[Row]>,
    scale: [f32; DIMS],
}

impl StaticEmbedding {
    pub fn from_bytes(b: &[u8]) -> Result<Self, TableError> {
        if b.len() < 16 || &b[..8] != MAGIC {
            return Err(TableError::Magic);
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let (rows, dims) = (u32_at(8) as usize, u32_at(12));
        if dims as usize != DIMS {
            return Err(TableError::Dims(dims));
        }
        let header = 16 + 4 * DIMS;
        let expected = header + rows * DIMS;
        if b.len() != expected {
            return Err(TableError::Size {
                found: b.len(),
                rows,
                expected,
            });
        }
        let mut scale = [0f32; DIMS];
        for (j, s) in scale.iter_mut().enumerate() {
            *s = f32::from_le_bytes(b[16 + 4 * j..20 + 4 * j].try_into().expect("4 bytes"));
            if !(s.is_finite() && *s > 0.0) {
                return Err(TableError::Scale);
            }
        }
        let rows = b[header..]
            .chunks_exact(DIMS)
            .map(|r| Row(std::array::from_fn(|j| r[j] as i8)))
            .collect();
        Ok(Self { rows, scale })
    }

    /// Rows in the table.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The L2-normalised mean of the rows of `ids` (ids past the table are skipped); zero for
    /// no tokens.
    pub fn embed(&self, ids: &[u32]) -> [f32; DIMS] {
        let mut sum = [0i32; DIMS];
        for &id in ids {
            if let Some(row) = self.rows.get(id as usize) {
                for (s, q) in sum.iter_mut().zip(row.0) {
                    *s += i32::from(q);
                }
            }
        }
        // The mean's 1/n cancels in the normalisation.
        let mut e = [0f32; DIMS];
        for ((e, s), scale) in e.iter_mut().zip(sum).zip(self.scale) {
            *e = s as f32 * scale;
        }
        let norm = e.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            for x in &mut e {
                *x /= norm;
            }
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compiled_in_table_loads() {
        let t = minilm();
        assert_eq!(t.len(), 30_522);
        let e = t.embed(&[1996, 3007, 1997, 2605]); // "the capital of france"
        let norm: f32 = e.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert_eq!(t.embed(&[]), [0.0; DIMS]);
        // The special tokens' rows are zero (SIF weight 0): they add nothing.
        assert_eq!(t.embed(&[101, 102, 0]), [0.0; DIMS]);
    }

    #[test]
    fn bad_tables_are_refused() {
        assert_eq!(
            StaticEmbedding::from_bytes(b"nonsense").unwrap_err(),
            TableError::Magic
        );
        let mut b = MAGIC.to_vec();
        b.extend(1u32.to_le_bytes());
        b.extend(32u32.to_le_bytes());
        assert_eq!(
            StaticEmbedding::from_bytes(&b).unwrap_err(),
            TableError::Dims(32)
        );
        let mut b = MAGIC.to_vec();
        b.extend(2u32.to_le_bytes());
        b.extend((DIMS as u32).to_le_bytes());
        b.extend(std::iter::repeat_n(0u8, 4 * DIMS + DIMS));
        assert!(matches!(
            StaticEmbedding::from_bytes(&b).unwrap_err(),
            TableError::Size { rows: 2, .. }
        ));
    }
}
