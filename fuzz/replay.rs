//! The short fuzzing run of the normal test suite (stable Rust, no libFuzzer).
//!
//! Not a fuzz target: each fuzzed crate includes this file in its unit tests
//! (`#[path = ".../fuzz/replay.rs"] mod replay;`) and calls [`replay`] with the same entry
//! function its fuzz target calls. That replays every committed seed and regression input of the
//! target (`fuzz/seeds/<target>/`), then a bounded, deterministic mutation pass over them (fixed
//! seed, byte-level mutations and splices in the spirit of libFuzzer's), so CI keeps every input
//! that once crashed and a few thousand near misses of the seeds, in well under a second, with no
//! nightly toolchain. The entry functions assert their own properties; a failure names the input.

use std::path::{Path, PathBuf};

/// Bytes that matter to the formats fuzzed here (JSON, YAML, SSE, Prometheus text, msgpack).
const INTERESTING: &[u8] =
    b"{}[]\":,.-+0123456789eE\\\n\r\t #:=!&*|>'%@\x00\x7f\x80\xc0\xc3\xd9\xdc\xde\xff";

/// The seed directory of `target`, found from the including crate's manifest directory.
fn seed_dir(manifest_dir: &str, target: &str) -> PathBuf {
    let mut dir = Some(Path::new(manifest_dir));
    while let Some(d) = dir {
        let seeds = d.join("fuzz").join("seeds").join(target);
        if seeds.is_dir() {
            return seeds;
        }
        dir = d.parent();
    }
    panic!("no fuzz/seeds/{target} above {manifest_dir}");
}

/// The committed inputs of `target`, by file name.
pub fn seeds(manifest_dir: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = seed_dir(manifest_dir, target);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "{} holds no seeds", dir.display());
    out
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One input mutated one to four times from `base` (and `other`, for splices).
fn mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = v.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let i = rng.below(len + 1);
                v.insert(i, INTERESTING[rng.below(INTERESTING.len())]);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(16));
                v.drain(i..i + n);
            }
            4 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(32));
                let chunk = v[i..i + n].to_vec();
                let at = rng.below(len + 1);
                v.splice(at..at, chunk);
            }
            5 if !other.is_empty() => {
                let cut = rng.below(len + 1);
                let from = rng.below(other.len());
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            6 if len > 0 => v.truncate(rng.below(len)),
            _ if len > 0 => {
                let i = rng.below(len);
                v[i] = rng.next() as u8;
            }
            _ => v.push(rng.next() as u8),
        }
    }
    v
}

/// Runs `entry` on every seed of `target`, then on `mutations` mutants of them; returns how many
/// inputs ran. A panic in `entry` fails the calling test with the input that caused it.
pub fn replay(manifest_dir: &str, target: &str, mutations: usize, entry: fn(&[u8])) -> usize {
    let seeds = seeds(manifest_dir, target);
    let run = |what: &str, input: &[u8]| {
        if std::panic::catch_unwind(|| entry(input)).is_err() {
            panic!(
                "fuzz target {target} failed on {what}: {:?}",
                String::from_utf8_lossy(input)
            );
        }
    };
    for (name, input) in &seeds {
        run(name, input);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ target.len() as u64);
    for i in 0..mutations {
        let base = &seeds[rng.below(seeds.len())].1;
        let other = &seeds[rng.below(seeds.len())].1;
        let input = mutate(&mut rng, base, other);
        run(&format!("mutant {i}"), &input);
    }
    seeds.len() + mutations
}
