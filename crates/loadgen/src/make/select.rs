//! Choosing which functions of the source trace a workload uses (thesis ch. 3.6: random,
//! representative per frequency quartile, rare).

use super::azure::SourceFunction;
use rand::seq::SliceRandom;
use rand::Rng;
use std::str::FromStr;

/// Which functions to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    All,
    /// N functions at random.
    Random(usize),
    /// N functions, a quarter from each frequency quartile.
    Representative(usize),
    /// The N least frequently invoked functions.
    Rare(usize),
}

impl std::fmt::Display for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selection::All => write!(f, "all"),
            Selection::Random(n) => write!(f, "random:{n}"),
            Selection::Representative(n) => write!(f, "representative:{n}"),
            Selection::Rare(n) => write!(f, "rare:{n}"),
        }
    }
}

impl FromStr for Selection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            return Ok(Selection::All);
        }
        let err =
            || format!("expected all, random:N, representative:N or rare:N (N ≥ 1), got {s:?}");
        let (kind, n) = s.split_once(':').ok_or_else(err)?;
        let n: usize = n.parse().ok().filter(|n| *n > 0).ok_or_else(err)?;
        match kind {
            "random" => Ok(Selection::Random(n)),
            "representative" => Ok(Selection::Representative(n)),
            "rare" => Ok(Selection::Rare(n)),
            _ => Err(err()),
        }
    }
}

/// Keeps the functions invoked at least twice in the window (never-reused functions say nothing
/// about keep-alive), then applies `sel`. The result keeps the source order.
pub fn select(
    functions: Vec<SourceFunction>,
    sel: Selection,
    rng: &mut impl Rng,
) -> Vec<SourceFunction> {
    let mut candidates: Vec<(usize, SourceFunction)> = functions
        .into_iter()
        .filter(|f| f.invocations() >= 2)
        .enumerate()
        .collect();
    let mut chosen: Vec<(usize, SourceFunction)> = match sel {
        Selection::All => candidates,
        Selection::Random(n) => {
            candidates.shuffle(rng);
            candidates.truncate(n);
            candidates
        }
        Selection::Rare(n) => {
            // Shuffle first so that ties among equally rare functions break at random.
            candidates.shuffle(rng);
            candidates.sort_by_key(|(_, f)| f.invocations());
            candidates.truncate(n);
            candidates
        }
        Selection::Representative(n) => {
            candidates.shuffle(rng);
            candidates.sort_by_key(|(_, f)| f.invocations());
            let len = candidates.len();
            let mut out = Vec::new();
            let mut quartiles: Vec<Vec<(usize, SourceFunction)>> = vec![Vec::new(); 4];
            for (i, c) in candidates.into_iter().enumerate() {
                quartiles[(i * 4 / len.max(1)).min(3)].push(c);
            }
            for (q, mut group) in quartiles.into_iter().enumerate() {
                // The remainder of n / 4 goes to the busiest quartiles.
                let take = n / 4 + usize::from(q >= 4 - n % 4);
                group.shuffle(rng);
                group.truncate(take);
                out.extend(group);
            }
            out
        }
    };
    chosen.sort_by_key(|(i, _)| *i);
    chosen.into_iter().map(|(_, f)| f).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn f(id: usize, n: u32) -> SourceFunction {
        SourceFunction {
            id: format!("h{id}"),
            per_minute: vec![n],
            avg_ms: 10.0,
            max_ms: 20.0,
            mem_mb: Some(64.0),
        }
    }

    #[test]
    fn parses_selections() {
        assert_eq!("rare:5".parse(), Ok(Selection::Rare(5)));
        assert_eq!("all".parse(), Ok(Selection::All));
        assert!("random:0".parse::<Selection>().is_err());
        assert!("top:3".parse::<Selection>().is_err());
    }

    #[test]
    fn selections_pick_what_they_say() {
        // 40 functions invoked 1..=40 times; the one invoked once is never eligible.
        let all: Vec<_> = (1..=40).map(|n| f(n as usize, n)).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let rare = select(all.clone(), Selection::Rare(3), &mut rng);
        let counts: Vec<u64> = rare.iter().map(|f| f.invocations()).collect();
        assert_eq!(counts, vec![2, 3, 4]);
        let rep = select(all.clone(), Selection::Representative(8), &mut rng);
        assert_eq!(rep.len(), 8);
        // Two from each quartile of the 39 eligible counts (2..=40).
        for (lo, hi) in [(2, 11), (12, 21), (22, 31), (32, 40)] {
            let n = rep
                .iter()
                .filter(|f| (lo..=hi).contains(&f.invocations()))
                .count();
            assert_eq!(n, 2, "quartile {lo}..={hi}: {rep:?}");
        }
        let a = select(
            all.clone(),
            Selection::Random(5),
            &mut ChaCha8Rng::seed_from_u64(1),
        );
        let b = select(
            all.clone(),
            Selection::Random(5),
            &mut ChaCha8Rng::seed_from_u64(1),
        );
        assert_eq!(a, b, "the same seed picks the same functions");
        assert_eq!(select(all, Selection::All, &mut rng).len(), 39);
    }
}
