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
    /// Deterministic arrivals every `1 / rate` s from t = 0 (Atoll's constant pattern).
    Constant { rate: f64 },
    /// Atoll's on/off pattern: on and off periods alternate, starting on; each period's length
    /// in whole seconds is drawn from a Poisson distribution of mean `mean_on` (at least 1 s)
    /// or `mean_off`, and each on period carries `requests` arrivals spread evenly over it.
    OnOffRequests {
        requests: u32,
        mean_on: Duration,
        mean_off: Duration,
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
            Shape::Poisson { rate } | Shape::OnOff { rate, .. } | Shape::Constant { rate }
                if !rate_ok(*rate) =>
            {
                Err(format!("--rate must be positive, got {rate}"))
            }
            Shape::OnOff { on, .. } if on.is_zero() => Err("--on must be positive".into()),
            Shape::OnOffRequests {
                requests, mean_on, ..
            } if *requests == 0 || mean_on.is_zero() => Err(format!(
                "on/off requests per on period and mean on time must be positive, got {requests} and {mean_on:?}"
            )),
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

    /// The background rate at `t` seconds, and its maximum (shapes with deterministic arrivals
    /// have their own generator and report their mean rate).
    fn rate_at(&self, t: f64) -> (f64, f64) {
        match *self {
            Shape::Poisson { rate } | Shape::Burst { rate, .. } | Shape::Constant { rate } => {
                (rate, rate)
            }
            Shape::OnOffRequests {
                requests,
                mean_on,
                mean_off,
            } => {
                let r = f64::from(requests) / (mean_on + mean_off).as_secs_f64();
                (r, r)
            }
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

/// A Poisson-distributed whole number of mean `mean` (Knuth's method; `mean` is a few tens at
/// most here, so the product stays well above underflow).
fn poisson(rng: &mut impl Rng, mean: f64) -> u64 {
    let limit = (-mean).exp();
    let (mut k, mut p) = (0u64, rng.gen::<f64>());
    while p > limit {
        k += 1;
        p *= rng.gen::<f64>();
    }
    k
}

/// `n` instants spread evenly over `[from, from + len)` seconds, those before `span` kept.
fn even(out: &mut Vec<u64>, from: f64, len: f64, n: u64, span: f64) {
    for i in 0..n {
        let t = from + i as f64 * len / n as f64;
        if t >= span {
            break;
        }
        out.push((t * 1e6).round() as u64);
    }
}

/// The arrival instants (µs, sorted) of one stream of `shape` over `[0, span)`; a burst's extra
/// function is left out.
pub fn instants(shape: &Shape, span: Duration, rng: &mut impl Rng) -> Result<Vec<u64>, String> {
    shape.check()?;
    let span_s = span.as_secs_f64();
    let mut out = Vec::new();
    match *shape {
        Shape::Constant { rate } => {
            let n = (span_s * rate).ceil() as u64;
            even(&mut out, 0.0, n as f64 / rate, n, span_s);
        }
        Shape::OnOffRequests {
            requests,
            mean_on,
            mean_off,
        } => {
            let mut t = 0.0;
            while t < span_s {
                let on = poisson(rng, mean_on.as_secs_f64()).max(1) as f64;
                even(&mut out, t, on, u64::from(requests), span_s);
                t += on + poisson(rng, mean_off.as_secs_f64()) as f64;
            }
        }
        _ => {
            let (_, max_rate) = shape.rate_at(0.0);
            out = thinned(rng, span_s, max_rate, |t| shape.rate_at(t).0);
        }
    }
    Ok(out)
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
    let mut out: Vec<(u64, usize)> = instants(shape, span, rng)?
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
    fn constant_is_exact_and_even() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let a = instants(
            &Shape::Constant { rate: 100.0 },
            Duration::from_secs(10),
            &mut rng,
        )
        .unwrap();
        assert_eq!(a.len(), 1000);
        assert!(a.windows(2).all(|w| w[1] - w[0] == 10_000), "evenly spaced");
        assert_eq!(a[0], 0);
    }

    #[test]
    fn on_off_requests_put_the_requests_in_on_periods() {
        let shape = Shape::OnOffRequests {
            requests: 300,
            mean_on: Duration::from_secs(5),
            mean_off: Duration::from_secs(5),
        };
        let a = instants(
            &shape,
            Duration::from_secs(600),
            &mut ChaCha8Rng::seed_from_u64(4),
        )
        .unwrap();
        // About 60 cycles of 10 s on average, 300 requests each.
        assert!((14_000..=22_000).contains(&a.len()), "{}", a.len());
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        // Gaps longer than an even spacing are the off periods: there are some, and between
        // two gaps there are whole on periods (multiples of 300 requests) except at the end.
        let gaps: Vec<usize> = a
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[1] - w[0] > 1_000_000)
            .map(|(i, _)| i + 1)
            .collect();
        assert!(gaps.len() > 10, "{}", gaps.len());
        assert!(gaps.iter().all(|i| i % 300 == 0), "{gaps:?}");
        let again = instants(
            &shape,
            Duration::from_secs(600),
            &mut ChaCha8Rng::seed_from_u64(4),
        )
        .unwrap();
        assert_eq!(a, again);
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
