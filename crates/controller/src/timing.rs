//! Reading and amending a worker's success answer without parsing the (arbitrary) result: the
//! timing object is always the last field, so only that tail is parsed and rewritten.

use serde_json::{Map, Value};

/// What the controller learns from a worker's success answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerTiming {
    pub cold: bool,
    /// The worker's own end-to-end time.
    pub e2e_us: u64,
}

const TIMING_KEY: &[u8] = b"\"timing\":";
const COLD_KEY: &[u8] = b",\"cold\":";

/// Splits `{..., "timing": {...}}` into the prefix up to the timing object and the object.
fn split(body: &[u8]) -> Option<(usize, Map<String, Value>)> {
    let end = body.iter().rposition(|c| !c.is_ascii_whitespace())?;
    if body[end] != b'}' {
        return None;
    }
    let at = body
        .windows(TIMING_KEY.len())
        .rposition(|w| w == TIMING_KEY)?
        + TIMING_KEY.len();
    let obj: Map<String, Value> = serde_json::from_slice(&body[at..end]).ok()?;
    Some((at, obj))
}

/// The worker's cold flag and end-to-end time, if the body has the usual shape.
pub fn read(body: &[u8]) -> Option<WorkerTiming> {
    let (at, obj) = split(body)?;
    Some(WorkerTiming {
        cold: cold_flag(&body[..at]),
        e2e_us: obj.get("e2e")?.as_u64()?,
    })
}

fn cold_flag(head: &[u8]) -> bool {
    head.windows(COLD_KEY.len())
        .rposition(|w| w == COLD_KEY)
        .is_some_and(|i| head[i + COLD_KEY.len()..].starts_with(b"true"))
}

/// Adds the controller's own time to the answer: `timing.controller` is `total_us` (at the
/// controller) minus the worker's `e2e`; `overhead` and `e2e` grow by it, so `overhead` stays
/// the whole control plane's cost. None when the body does not have the usual shape.
pub fn add_controller_time(body: &[u8], total_us: u64) -> Option<(Vec<u8>, WorkerTiming)> {
    let (at, mut obj) = split(body)?;
    let worker_e2e = obj.get("e2e")?.as_u64()?;
    let ours = total_us.saturating_sub(worker_e2e);
    let overhead = obj.get("overhead").and_then(Value::as_u64).unwrap_or(0);
    obj.insert("overhead".into(), Value::from(overhead + ours));
    obj.insert("e2e".into(), Value::from(worker_e2e + ours));
    obj.insert("controller".into(), Value::from(ours));
    let mut out = Vec::with_capacity(body.len() + 24);
    out.extend_from_slice(&body[..at]);
    serde_json::to_writer(&mut out, &obj).ok()?;
    out.push(b'}');
    let timing = WorkerTiming {
        cold: cold_flag(&body[..at]),
        e2e_us: worker_e2e,
    };
    Some((out, timing))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"result":{"timing":{"e2e":1},"cold":true},"cold":false,"worker":"w","timing":{"queue":0,"init":0,"exec":1000,"overhead":40,"e2e":1040}}"#;

    #[test]
    fn the_trailing_timing_object_is_read_even_when_the_result_mimics_it() {
        assert_eq!(
            read(BODY),
            Some(WorkerTiming {
                cold: false,
                e2e_us: 1040
            })
        );
        assert_eq!(read(b"{\"error\":{}}"), None);
        assert_eq!(read(b"not json"), None);
    }

    #[test]
    fn controller_time_is_added_to_overhead_and_e2e() {
        let (out, t) = add_controller_time(BODY, 1100).unwrap();
        assert_eq!(t.e2e_us, 1040);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["timing"]["controller"], 60);
        assert_eq!(v["timing"]["overhead"], 100);
        assert_eq!(v["timing"]["e2e"], 1100);
        assert_eq!(v["timing"]["exec"], 1000);
        assert_eq!(v["result"]["cold"], true, "the result is untouched");
        assert_eq!(v["worker"], "w");
    }
}
