//! What one stream sends next: a snapshot first, then only the readings that changed.
//!
//! An engine's gauges often stay put for many scrapes (an idle replica reads `0 waiting, 0
//! running` all day), so a stream carries an endpoint only when its values changed, or when the
//! copy its sidecar holds has grown older than the refresh interval: the router charges a reading
//! older than its freshness budget (500 ms) as stale, and an unchanged engine must not look like
//! a wedged one. Each reading carries its age when written, so the sidecar dates it on its own
//! clock. Pure: the state, the time and what was sent in, the message out.

use kinference_proxy_api::signals as api;
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};
use tokio::time::Instant;

/// One endpoint's last successful reading.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The reading, its `addr` set and `age_ms` 0; `failures` counts failed scrapes since.
    pub values: api::EndpointReading,
    /// When the scrape that read it was sent.
    pub at: Instant,
}

/// One endpoint's last successful `GET /load`.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct LoadEntry {
    pub value: u32,
    /// When the read was sent.
    pub at: Instant,
}

/// A pool's readings, by endpoint address (`ip:port`). Endpoints not read yet are absent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolState {
    pub endpoints: BTreeMap<String, Entry>,
    /// `GET /load`, read apart from the metrics and more often.
    pub loads: BTreeMap<String, LoadEntry>,
    /// The latest step notice on each endpoint (docs/signals.md, "Step notices"), with when it
    /// arrived: a value, not a queue, so a stream sends each endpoint's newest one once.
    pub steps: BTreeMap<String, (Instant, Arc<api::Notice>)>,
}

/// What one stream has sent: each endpoint's values and the read time of that copy.
#[derive(Clone, Debug, Default)]
pub struct Sent {
    held: HashMap<String, (api::EndpointReading, Instant)>,
    loads: HashMap<String, LoadEntry>,
    /// When each endpoint's step notice sent last had arrived.
    steps: HashMap<String, Instant>,
}

/// Whether a held copy read at `held_at` is to be sent again: its value changed, or a newer read
/// of the same value exists and the copy is older than `refresh`.
fn due(changed: bool, held_at: Instant, at: Instant, now: Instant, refresh: Duration) -> bool {
    changed || (at > held_at && now.saturating_duration_since(held_at) >= refresh)
}

fn age_ms(now: Instant, at: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(u64::MAX)
}

/// The next message of a stream that has sent `sent` (`None`: nothing yet), or `None` when there
/// is nothing new. `version` is left 0 for the stream to number.
pub fn next(
    sent: &mut Option<Sent>,
    state: &PoolState,
    now: Instant,
    refresh: Duration,
) -> Option<api::SignalsUpdate> {
    let full = sent.is_none();
    let held = sent.get_or_insert_with(Sent::default);
    let mut readings = Vec::new();
    for (addr, e) in &state.endpoints {
        let send = match held.held.get(addr) {
            None => true,
            Some((values, at)) => due(*values != e.values, *at, e.at, now, refresh),
        };
        if !send {
            continue;
        }
        let mut r = e.values.clone();
        r.age_ms = age_ms(now, e.at);
        readings.push(r);
        held.held.insert(addr.clone(), (e.values.clone(), e.at));
    }
    let mut loads = Vec::new();
    for (addr, l) in &state.loads {
        let send = match held.loads.get(addr) {
            None => true,
            Some(h) => due(h.value != l.value, h.at, l.at, now, refresh),
        };
        if !send {
            continue;
        }
        loads.push(api::LoadReading {
            addr: addr.clone(),
            age_ms: age_ms(now, l.at),
            server_load: l.value,
        });
        held.loads.insert(addr.clone(), *l);
    }
    held.loads.retain(|a, _| state.loads.contains_key(a));
    let mut notices = Vec::new();
    for (addr, (arrived, n)) in &state.steps {
        if held.steps.get(addr) == Some(arrived) {
            continue;
        }
        let mut n = (**n).clone();
        let held_for = now.saturating_duration_since(*arrived).as_micros();
        n.age_us = n
            .age_us
            .saturating_add(u64::try_from(held_for).unwrap_or(u64::MAX));
        notices.push(n);
        held.steps.insert(addr.clone(), *arrived);
    }
    held.steps.retain(|a, _| state.steps.contains_key(a));
    let mut removed: Vec<String> = held
        .held
        .keys()
        .filter(|a| !state.endpoints.contains_key(*a))
        .cloned()
        .collect();
    removed.sort();
    for a in &removed {
        held.held.remove(a);
    }
    if !full && readings.is_empty() && loads.is_empty() && removed.is_empty() && notices.is_empty()
    {
        return None;
    }
    Some(api::SignalsUpdate {
        version: 0,
        full,
        readings,
        removed,
        loads,
        notices,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(addr: &str, waiting: u32) -> api::EndpointReading {
        api::EndpointReading {
            addr: addr.into(),
            num_requests_waiting: Some(waiting),
            ..Default::default()
        }
    }

    fn state(entries: &[(&str, u32, Instant)]) -> PoolState {
        PoolState {
            endpoints: entries
                .iter()
                .map(|(a, w, at)| {
                    (
                        a.to_string(),
                        Entry {
                            values: reading(a, *w),
                            at: *at,
                        },
                    )
                })
                .collect(),
            loads: BTreeMap::new(),
            steps: BTreeMap::new(),
        }
    }

    const REFRESH: Duration = Duration::from_millis(100);

    #[tokio::test(start_paused = true)]
    async fn a_snapshot_then_only_changes_with_their_ages() {
        let t0 = Instant::now();
        let mut sent = None;
        let now = t0 + Duration::from_millis(30);
        let first = next(
            &mut sent,
            &state(&[("a:1", 1, t0), ("b:1", 2, t0)]),
            now,
            REFRESH,
        )
        .unwrap();
        assert!(first.full);
        assert_eq!(first.readings.len(), 2);
        assert_eq!(first.readings[0].age_ms, 30);
        // Re-read unchanged within the refresh interval: nothing to say.
        let t1 = t0 + Duration::from_millis(50);
        let now = t1 + Duration::from_millis(5);
        assert_eq!(
            next(
                &mut sent,
                &state(&[("a:1", 1, t1), ("b:1", 2, t1)]),
                now,
                REFRESH
            ),
            None
        );
        // One changed: only it is sent.
        let m = next(
            &mut sent,
            &state(&[("a:1", 1, t1), ("b:1", 5, t1)]),
            now,
            REFRESH,
        )
        .unwrap();
        assert!(!m.full);
        assert_eq!(
            m.readings,
            vec![api::EndpointReading {
                age_ms: 5,
                ..reading("b:1", 5)
            }]
        );
        // The held copy of `a` grows older than the refresh interval: re-sent, fresher.
        let t2 = t0 + Duration::from_millis(150);
        let m = next(
            &mut sent,
            &state(&[("a:1", 1, t2), ("b:1", 5, t1)]),
            t2,
            REFRESH,
        )
        .unwrap();
        assert_eq!(m.readings, vec![reading("a:1", 1)]);
        // An endpoint that left the pool is named once.
        let m = next(&mut sent, &state(&[("a:1", 1, t2)]), t2, REFRESH).unwrap();
        assert_eq!(m.removed, vec!["b:1".to_string()]);
        assert!(m.readings.is_empty());
        assert_eq!(
            next(&mut sent, &state(&[("a:1", 1, t2)]), t2, REFRESH),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_engine_that_stops_answering_is_not_refreshed() {
        let t0 = Instant::now();
        let mut sent = None;
        next(&mut sent, &state(&[("a:1", 1, t0)]), t0, REFRESH).unwrap();
        // No newer scrape: however late, the old reading is not sent again (it ages at the
        // sidecar, which is what makes its router fall back).
        let late = t0 + Duration::from_secs(5);
        assert_eq!(
            next(&mut sent, &state(&[("a:1", 1, t0)]), late, REFRESH),
            None
        );
    }

    /// Loads travel apart from the readings, by the same rules: all in the snapshot, then only
    /// the changed ones, an unchanged one again once its copy is older than the refresh interval,
    /// each with its own age; a load alone makes a message.
    #[tokio::test(start_paused = true)]
    async fn loads_are_sent_when_they_change_with_their_own_ages() {
        let t0 = Instant::now();
        let with_loads = |loads: &[(&str, u32, Instant)]| {
            let mut s = state(&[("a:1", 1, t0)]);
            s.loads = loads
                .iter()
                .map(|(a, value, at)| {
                    (
                        a.to_string(),
                        LoadEntry {
                            value: *value,
                            at: *at,
                        },
                    )
                })
                .collect();
            s
        };
        let load = |addr: &str, server_load, age_ms| api::LoadReading {
            addr: addr.into(),
            age_ms,
            server_load,
        };
        let mut sent = None;
        let ms = |n| Duration::from_millis(n);
        let first = next(
            &mut sent,
            &with_loads(&[("a:1", 0, t0)]),
            t0 + ms(3),
            REFRESH,
        )
        .unwrap();
        assert!(first.full);
        assert_eq!(first.loads, vec![load("a:1", 0, 3)]);
        // Read again unchanged 10 ms later: nothing, although the metrics reading is as it was.
        let now = t0 + ms(12);
        assert_eq!(
            next(
                &mut sent,
                &with_loads(&[("a:1", 0, t0 + ms(10))]),
                now,
                REFRESH
            ),
            None
        );
        // A new request: only the load is sent, two milliseconds old.
        let m = next(
            &mut sent,
            &with_loads(&[("a:1", 1, t0 + ms(20))]),
            t0 + ms(22),
            REFRESH,
        )
        .unwrap();
        assert!(!m.full && m.readings.is_empty());
        assert_eq!(m.loads, vec![load("a:1", 1, 2)]);
        // Unchanged for longer than the refresh interval: sent again with its newer date.
        let m = next(
            &mut sent,
            &with_loads(&[("a:1", 1, t0 + ms(125))]),
            t0 + ms(125),
            REFRESH,
        )
        .unwrap();
        assert_eq!(m.loads, vec![load("a:1", 1, 0)]);
        // An endpoint that has only a load (its metrics failing) is sent its load.
        let m = next(
            &mut sent,
            &with_loads(&[("a:1", 1, t0 + ms(125)), ("b:1", 4, t0 + ms(130))]),
            t0 + ms(131),
            REFRESH,
        )
        .unwrap();
        assert_eq!(m.loads, vec![load("b:1", 4, 1)]);
    }

    /// Each endpoint's newest step notice goes out once, aged by the time the service held it;
    /// one that did not change is not sent again.
    #[tokio::test(start_paused = true)]
    async fn a_step_notice_is_sent_once_per_change_aged_by_its_hold() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let step = |id: u64| {
            Arc::new(api::Notice {
                addr: "a:1".into(),
                sender: "s".into(),
                request_id: id,
                age_us: 300,
                event: Some(api::notice::Event::Step(api::Step {})),
                ..Default::default()
            })
        };
        let mut state = PoolState::default();
        state.steps.insert("a:1".into(), (t0, step(7)));
        let mut sent = None;
        let m = next(&mut sent, &state, t0 + ms(4), REFRESH).unwrap();
        assert_eq!(m.notices.len(), 1);
        assert_eq!((m.notices[0].request_id, m.notices[0].age_us), (7, 4_300));
        assert!(next(&mut sent, &state, t0 + ms(6), REFRESH).is_none());
        state.steps.insert("a:1".into(), (t0 + ms(10), step(8)));
        let m = next(&mut sent, &state, t0 + ms(12), REFRESH).unwrap();
        assert_eq!((m.notices[0].request_id, m.notices[0].age_us), (8, 2_300));
    }

    #[tokio::test(start_paused = true)]
    async fn an_empty_pool_still_gets_a_snapshot() {
        let mut sent = None;
        let m = next(&mut sent, &PoolState::default(), Instant::now(), REFRESH).unwrap();
        assert!(m.full && m.readings.is_empty());
    }
}
