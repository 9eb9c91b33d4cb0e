//! `runc.cpuset`: the CPUs a worker's sandboxes may run on, in the kernel's list format
//! (`0`, `0-3`, `0,2-3`). Several workers on one host each pinned to their own CPUs act as
//! separate nodes (the measurement study's consolidation policies, bench/consolidation.sh), and
//! an operator can keep sandboxes off the CPUs the control plane uses.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// The highest CPU number accepted (the kernel's default `NR_CPUS` on x86-64 is 8192; a
/// larger number is a typo, and the bound keeps the parsed list small).
pub const MAX_CPU: u32 = 8191;

/// A non-empty set of CPU numbers, kept sorted and without duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSet(Vec<u32>);

/// Why a CPU list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetError {
    #[error("a CPU list like \"0\", \"0-3\" or \"0,2-3\" is expected")]
    Syntax,
    #[error("CPU numbers must be at most {MAX_CPU}")]
    TooLarge,
    #[error("a range must go upwards (\"2-3\", not \"3-2\")")]
    Backwards,
    #[error("CPU {0} is not online on this host (online: {1})")]
    Offline(u32, String),
}

impl CpuSet {
    /// Parses the kernel's list format; whitespace around items is allowed.
    pub fn parse(s: &str) -> Result<CpuSet, CpuSetError> {
        // A list longer than every CPU written out is not a list.
        if s.len() > 64 * 1024 {
            return Err(CpuSetError::Syntax);
        }
        let mut cpus = Vec::new();
        for item in s.split(',') {
            let item = item.trim();
            let (lo, hi) = match item.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => {
                    let n = number(item)?;
                    (n, n)
                }
            };
            if lo > hi {
                return Err(CpuSetError::Backwards);
            }
            cpus.extend(lo..=hi);
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(CpuSet(cpus))
    }

    /// The CPUs, ascending.
    pub fn cpus(&self) -> &[u32] {
        &self.0
    }

    /// How many CPUs the set holds (never 0).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: an empty list does not parse.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Refuses a CPU that is not in `online` (the contents of
    /// `/sys/devices/system/cpu/online`): runc would fail every sandbox on it.
    pub fn check_online(&self, online: &str) -> Result<(), CpuSetError> {
        let online_set = CpuSet::parse(online.trim()).map_err(|_| CpuSetError::Syntax)?;
        match self
            .0
            .iter()
            .find(|c| online_set.0.binary_search(c).is_err())
        {
            Some(c) => Err(CpuSetError::Offline(*c, online_set.to_string())),
            None => Ok(()),
        }
    }
}

fn number(s: &str) -> Result<u32, CpuSetError> {
    let s = s.trim();
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CpuSetError::Syntax);
    }
    let n: u32 = s.parse().map_err(|_| CpuSetError::Syntax)?;
    if n > MAX_CPU {
        return Err(CpuSetError::TooLarge);
    }
    Ok(n)
}

/// The canonical list: ranges of consecutive CPUs joined by commas (`0-2,5`), as the kernel
/// writes `cpuset.cpus`.
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        let mut first = true;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A string, or a bare number (`HEARTH_RUNC__CPUSET=1` reaches serde as an integer).
impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CpuSet, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        let text = match Raw::deserialize(d)? {
            Raw::Number(n) => n.to_string(),
            Raw::Text(s) => s,
        };
        CpuSet::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_to_sorted_sets_and_print_canonically() {
        for (text, cpus, canonical) in [
            ("0", vec![0], "0"),
            ("0-3", vec![0, 1, 2, 3], "0-3"),
            ("3, 0-1 ,7", vec![0, 1, 3, 7], "0-1,3,7"),
            ("2,2,1-2", vec![1, 2], "1-2"),
            ("5-5", vec![5], "5"),
        ] {
            let set = CpuSet::parse(text).unwrap();
            assert_eq!(set.cpus(), cpus.as_slice(), "{text}");
            assert_eq!(set.to_string(), canonical, "{text}");
        }
    }

    #[test]
    fn malformed_lists_are_refused() {
        for bad in [
            "", " ", "a", "1,", ",1", "1-", "-1", "1--2", "0x1", "+1", "1 2", "1.0",
        ] {
            assert_eq!(CpuSet::parse(bad), Err(CpuSetError::Syntax), "{bad:?}");
        }
        assert_eq!(CpuSet::parse("3-2"), Err(CpuSetError::Backwards));
        assert_eq!(CpuSet::parse("8192"), Err(CpuSetError::TooLarge));
        assert_eq!(CpuSet::parse("0-99999"), Err(CpuSetError::TooLarge));
        assert_eq!(CpuSet::parse("0-999999"), Err(CpuSetError::Syntax));
        assert_eq!(
            CpuSet::parse(&"1,".repeat(40_000)),
            Err(CpuSetError::Syntax)
        );
    }

    #[test]
    fn cpus_not_online_are_refused_by_number() {
        let set = CpuSet::parse("0,3").unwrap();
        assert_eq!(set.check_online("0-3\n"), Ok(()));
        assert_eq!(
            set.check_online("0-1\n"),
            Err(CpuSetError::Offline(3, "0-1".into()))
        );
    }

    #[test]
    fn a_number_or_a_string_deserializes() {
        #[derive(Deserialize)]
        struct C {
            cpuset: CpuSet,
        }
        let c: C = serde_json::from_str(r#"{"cpuset": 1}"#).unwrap();
        assert_eq!(c.cpuset.cpus(), [1]);
        let c: C = serde_json::from_str(r#"{"cpuset": "0-1"}"#).unwrap();
        assert_eq!(c.cpuset.cpus(), [0, 1]);
        assert!(serde_json::from_str::<C>(r#"{"cpuset": "1-0"}"#).is_err());
        assert_eq!(
            serde_json::to_string(&CpuSet::parse("1,0").unwrap()).unwrap(),
            "\"0-1\""
        );
    }
}
