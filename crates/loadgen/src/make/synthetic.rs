//! Synthetic arrival shapes: Poisson, on/off, sinusoidal, and a burst of one function over a
//! Poisson background (Atoll's and the thesis's bursty workloads).

use rand::Rng;
use std::f64::consts::PI;
use std::time::Duration;

/// How the total arrival rate evolves.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Constant rate (/s).
    Poisson { rate: f64 },
    /// `rate` during `on`, silence during `off`, repeating.
    OnOff {
        rate: f64,
        on: Duration,
        off: Duration,
    },
    /// `rate × (1 + amplitude × sin(2πt / period))`, amplitude in [0, 1].
    Sine {
        rate: f64,
        amplitude: f64,
        period: Duration,
    },
    /// A Poisson background at `rate` plus one extra function at `burst_rate` during
    /// [`at`, `at + length`).
    Burst {
        rate: f64,
        burst_rate: f64,
        at: Duration,
        length: Duration,
    },
}

impl Shape {
    fn check(&self) -> Result<(), String> {
        let rate_ok = |r: f64| r.is_finite() && r > 0.0;
        match self {
            Shape::Poisson { rate } | Shape::OnOff { rate, .. } if !rate_ok(*rate) => {
                Err(format!("--rate must be positive, got {rate}"))
            }
            Shape::OnOff { on, .. } if on.is_zero() => Err("--on must be positive".into()),
            Shape::Sine {
                rate,
                amplitude,
                period,
            } => {
                if !rate_ok(*rate) {
                    Err(format!("--rate must be positive, got {rate}"))
                } else if !(0.0..=1.0).contains(amplitude) {
                    Err(format!("--amplitude must be in [0, 1], got {amplitude}"))
                } else if period.is_zero() {
                    Err("--period must be positive".into())
                } else {
                    Ok(())
                }
            }
            Shape::Burst {
                rate, burst_rate, ..
            } if !rate_ok(*rate) || !rate_ok(*burst_rate) => Err(format!(
                "--rate and --burst-rate must be positive, got {rate} and {burst_rate}"
            )),
            _ => Ok(()),
        }
    }

    /// The background rate at `t` seconds, and its maximum.
    fn rate_at(&self, t: f64) -> (f64, f64) {
        match *self {
            Shape::Poisson { rate } | Shape::Burst { rate, .. } => (rate, rate),
            Shape::OnOff { rate, on, off } => {
                let cycle = (on + off).as_secs_f64();
                let on_now = t % cycle < on.as_secs_f64();
                (if on_now { rate } else { 0.0 }, rate)
            }
            Shape::Sine {
                rate,
                amplitude,
                period,
            } => {
                let r = rate * (1.0 + amplitude * (2.0 * PI * t / period.as_secs_f64()).sin());
                (r, rate * (1.0 + amplitude))
            }
        }
    }
}

/// Arrival instants (µs) of a Poisson process whose rate follows `rate_at`, over `[0, span)`,
/// by thinning a process at the maximum rate.
fn thinned(rng: &mut impl Rng, span: f64, max_rate: f64, rate_at: impl Fn(f64) -> f64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        t += -(1.0 - rng.gen::<f64>()).ln() / max_rate;
        if t >= span {
            return out;
        }
        if rng.gen::<f64>() * max_rate < rate_at(t) {
            out.push((t * 1e6) as u64);
        }
    }
}

/// Background arrivals over `functions` (chosen uniformly), plus the burst function's arrivals
/// (index `functions`) for a burst shape. Returns `(at_us, function index)`.
pub fn arrivals(
    shape: &Shape,
    span: Duration,
    functions: usize,
    rng: &mut impl Rng,
) -> Result<Vec<(u64, usize)>, String> {
    shape.check()?;
    if functions == 0 {
        return Err("--functions must be at least 1".into());
    }
    let span_s = span.as_secs_f64();
    let (_, max_rate) = shape.rate_at(0.0);
    let mut out: Vec<(u64, usize)> = thinned(rng, span_s, max_rate, |t| shape.rate_at(t).0)
        .into_iter()
        .map(|at| (at, rng.gen_range(0..functions)))
        .collect();
    if let Shape::Burst {
        burst_rate,
        at,
        length,
        ..
    } = *shape
    {
        let (from, to) = (at.as_secs_f64(), (at + length).as_secs_f64().min(span_s));
        for t in thinned(rng, (to - from).max(0.0), burst_rate, |_| burst_rate) {
            out.push((t + (from * 1e6) as u64, functions));
        }
    }
    out.sort_by_key(|(at, _)| *at);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn count_in(a: &[(u64, usize)], from_s: f64, to_s: f64) -> usize {
        a.iter()
            .filter(|(t, _)| (from_s * 1e6..to_s * 1e6).contains(&(*t as f64)))
            .count()
    }

    #[test]
    fn poisson_has_its_rate_and_is_reproducible() {
        let s = Shape::Poisson { rate: 200.0 };
        let a = arrivals(
            &s,
            Duration::from_secs(50),
            4,
            &mut ChaCha8Rng::seed_from_u64(3),
        )
        .unwrap();
        // 10,000 expected; a Poisson count is within ±4% with overwhelming probability.
        assert!((9600..=10400).contains(&a.len()), "{}", a.len());
        assert!(a.iter().all(|(_, f)| *f < 4));
        let b = arrivals(
            &s,
            Duration::from_secs(50),
            4,
            &mut ChaCha8Rng::seed_from_u64(3),
        )
        .unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn shapes_put_arrivals_where_they_say() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let onoff = Shape::OnOff {
            rate: 100.0,
            on: Duration::from_secs(10),
            off: Duration::from_secs(10),
        };
        let a = arrivals(&onoff, Duration::from_secs(40), 1, &mut rng).unwrap();
        assert_eq!(count_in(&a, 10.0, 20.0) + count_in(&a, 30.0, 40.0), 0);
        assert!(count_in(&a, 0.0, 10.0) > 800);
        let sine = Shape::Sine {
            rate: 100.0,
            amplitude: 1.0,
            period: Duration::from_secs(40),
        };
        let a = arrivals(&sine, Duration::from_secs(40), 1, &mut rng).unwrap();
        // The first half-period carries the crest, the second the trough.
        assert!(count_in(&a, 0.0, 20.0) > 4 * count_in(&a, 20.0, 40.0));
        let burst = Shape::Burst {
            rate: 10.0,
            burst_rate: 500.0,
            at: Duration::from_secs(5),
            length: Duration::from_secs(2),
        };
        let a = arrivals(&burst, Duration::from_secs(10), 3, &mut rng).unwrap();
        let bursty: Vec<_> = a.iter().filter(|(_, f)| *f == 3).collect();
        assert!(bursty.len() > 800, "{}", bursty.len());
        assert!(bursty
            .iter()
            .all(|(t, _)| (5_000_000..7_000_000).contains(t)));
    }

    #[test]
    fn bad_shapes_are_refused() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let bad = Shape::Sine {
            rate: 1.0,
            amplitude: 2.0,
            period: Duration::from_secs(1),
        };
        assert!(arrivals(&bad, Duration::from_secs(1), 1, &mut rng)
            .unwrap_err()
            .contains("amplitude"));
        let bad = Shape::Poisson { rate: 0.0 };
        assert!(arrivals(&bad, Duration::from_secs(1), 1, &mut rng).is_err());
    }
}
