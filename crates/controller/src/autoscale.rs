//! Horizontal autoscaling of a real cluster (docs/autoscaling.md): a task that hands the core's
//! [`Autoscaler`] the balancer's view of the workers' reported loads every `interval_ms`, and
//! carries a decision out the only way a controller can: by telling the operator's tooling. It
//! runs a configured command (an argv, no shell) and/or POSTs the decision to a webhook; that
//! tooling starts workers (which then join with the cluster key, as any worker) or stops the
//! named ones (a worker that stops gracefully leaves the ring and finishes its work).
//!
//! The command's output goes to the controller's log only (bounded), never to a client; it runs
//! for at most `action_timeout_ms` and is killed after (its own children, e.g. a worker it
//! started in the background, are left alone: starting them is its purpose).

use crate::facade::Controller;
use crate::forward::Forwarder;
use bytes::Bytes;
use hearth_core::autoscale::{AutoscaleParams, Autoscaler, Direction, Sample, ScaleDecision};
use hyper::Method;
use serde::{Deserialize, Serialize};
use std::sync::Weak;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// `[autoscale]`: when it acts, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoscaleConfig {
    /// How often the autoscaler reads the workers' loads.
    pub interval_ms: u64,
    /// Program and arguments run on each decision (no shell; empty: none). The decision is in
    /// its environment: `HEARTH_SCALE_DIRECTION` (`out`/`in`), `HEARTH_SCALE_COUNT`,
    /// `HEARTH_SCALE_WORKERS`, `HEARTH_SCALE_TARGET`, `HEARTH_SCALE_REMOVE` (worker names,
    /// comma-separated), `HEARTH_SCALE_REASON` and `HEARTH_SCALE_EVENT` (the webhook's JSON).
    pub command: Vec<String>,
    /// URL the decision is POSTed to as JSON (`http://` or `https://`; unset: none).
    pub webhook: Option<String>,
    /// Longest a command may run, and a webhook call may take.
    pub action_timeout_ms: u64,
    /// The control law (`[autoscale.params]`).
    pub params: AutoscaleParams,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        AutoscaleConfig {
            interval_ms: 5_000,
            command: Vec::new(),
            webhook: None,
            action_timeout_ms: 30_000,
            params: AutoscaleParams::default(),
        }
    }
}

/// Bounds of the `[autoscale]` keys.
const MAX_ARGS: usize = 64;
const MAX_ARG_BYTES: usize = 4096;
const MAX_URL_BYTES: usize = 2048;
/// Bytes of a command's stdout and stderr kept for the log, each.
const MAX_LOGGED_OUTPUT: usize = 4096;
/// After the command exits, how long its output pipes may stay open (a child it started in the
/// background may hold them) before the controller stops reading them.
const OUTPUT_GRACE: Duration = Duration::from_millis(500);

impl AutoscaleConfig {
    /// Refuses settings that cannot work; messages name the key, never a path or the URL.
    pub fn check(&self) -> Result<(), String> {
        self.params.check().map_err(|e| e.to_string())?;
        if !(10..=600_000).contains(&self.interval_ms) {
            return Err(format!(
                "autoscale.interval_ms must be between 10 and 600000, got {}",
                self.interval_ms
            ));
        }
        if !(100..=600_000).contains(&self.action_timeout_ms) {
            return Err(format!(
                "autoscale.action_timeout_ms must be between 100 and 600000, got {}",
                self.action_timeout_ms
            ));
        }
        if self.command.is_empty() && self.webhook.is_none() {
            return Err("autoscale needs a command or a webhook to act with".into());
        }
        if self.command.len() > MAX_ARGS {
            return Err(format!(
                "autoscale.command may have at most {MAX_ARGS} arguments, got {}",
                self.command.len()
            ));
        }
        if self.command.first().is_some_and(|p| p.trim().is_empty()) {
            return Err("autoscale.command's program (its first entry) is empty".into());
        }
        if self
            .command
            .iter()
            .any(|a| a.len() > MAX_ARG_BYTES || a.contains('\0'))
        {
            return Err(format!(
                "autoscale.command arguments must be under {MAX_ARG_BYTES} bytes, without NUL"
            ));
        }
        if let Some(u) = &self.webhook {
            let scheme_ok = u.starts_with("http://") || u.starts_with("https://");
            if !scheme_ok || u.len() > MAX_URL_BYTES || u.parse::<hyper::Uri>().is_err() {
                return Err(format!(
                    "autoscale.webhook must be an http:// or https:// URL of at most {MAX_URL_BYTES} bytes"
                ));
            }
        }
        Ok(())
    }
}

/// What the operator's tooling receives.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ScaleEvent {
    pub direction: Direction,
    pub count: u32,
    /// Active workers now, and once the decision is carried out.
    pub workers: u32,
    pub target_workers: u32,
    /// Scaling in: the workers to stop (least loaded first).
    pub remove: Vec<RemovedWorker>,
    pub reason: String,
    pub mean_load: f64,
    pub overloaded: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RemovedWorker {
    pub worker: String,
    pub url: String,
}

/// The autoscaler task; ends when the controller does.
pub(crate) async fn run(c: Weak<Controller>, config: AutoscaleConfig, hook: Forwarder) {
    let mut scaler = match Autoscaler::new(config.params.clone()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "autoscaler not started");
            return;
        }
    };
    // Workers that are up report within the status timeout: before it, an empty ring means
    // nothing yet, not "below min_workers".
    let grace = match c.upgrade() {
        Some(ctl) => Duration::from_millis(ctl.config().status_timeout_ms),
        None => return,
    };
    tokio::time::sleep(grace).await;
    let interval = Duration::from_millis(config.interval_ms);
    loop {
        let event = {
            let Some(ctl) = c.upgrade() else { return };
            let driver = ctl.driver();
            let now = driver.now();
            let samples: Vec<Sample> = driver.read(|b| {
                let w = b.workers();
                w.live()
                    .iter()
                    .map(|id| Sample {
                        worker: id.0,
                        load: w.load(*id),
                    })
                    .collect()
            });
            scaler.observe(now, &samples).map(|d| event_of(&ctl, &d))
        };
        if let Some(event) = event {
            tracing::info!(
                direction = event.direction.as_str(),
                count = event.count,
                workers = event.workers,
                reason = %event.reason,
                "autoscaling"
            );
            act(&config, &event, &hook).await;
        }
        tokio::time::sleep(interval).await;
    }
}

fn event_of(ctl: &Controller, d: &ScaleDecision) -> ScaleEvent {
    let remove = d
        .remove
        .iter()
        .filter_map(|id| {
            let m = ctl.driver().member(hearth_core::balance::WorkerId(*id))?;
            Some(RemovedWorker {
                worker: m.name.clone(),
                url: m.url.clone(),
            })
        })
        .collect();
    ScaleEvent {
        direction: d.direction,
        count: d.count,
        workers: d.workers,
        target_workers: d.target_workers,
        remove,
        reason: d.reason(),
        mean_load: d.mean_load,
        overloaded: d.overloaded,
    }
}

/// Runs the command and calls the webhook (whichever are configured); failures are logged.
async fn act(config: &AutoscaleConfig, event: &ScaleEvent, hook: &Forwarder) {
    let json = match serde_json::to_vec(event) {
        Ok(j) => j,
        Err(e) => {
            tracing::error!(error = %e, "autoscale event not serializable");
            return;
        }
    };
    let timeout = Duration::from_millis(config.action_timeout_ms);
    if !config.command.is_empty() {
        match run_command(&config.command, event, &json, timeout).await {
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %e, "autoscale command failed"),
        }
    }
    if let Some(url) = &config.webhook {
        match hook
            .send(Method::POST, url, "", Bytes::from(json), timeout)
            .await
        {
            Ok(a) if a.is_success() => {}
            Ok(a) => tracing::warn!(status = %a.status, "autoscale webhook answered an error"),
            Err(e) => tracing::warn!(error = %e, "autoscale webhook failed"),
        }
    }
}

/// Why a command did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("could not start it: {0}")]
    Spawn(std::io::Error),
    #[error("it did not finish within {0:?} and was killed")]
    TimedOut(Duration),
    #[error("waiting for it failed: {0}")]
    Wait(std::io::Error),
    #[error("it exited with {0}")]
    Exit(std::process::ExitStatus),
}

async fn run_command(
    argv: &[String],
    event: &ScaleEvent,
    json: &[u8],
    timeout: Duration,
) -> Result<(), CommandError> {
    let Some((program, args)) = argv.split_first() else {
        return Ok(());
    };
    let remove: Vec<&str> = event.remove.iter().map(|r| r.worker.as_str()).collect();
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("HEARTH_SCALE_DIRECTION", event.direction.as_str())
        .env("HEARTH_SCALE_COUNT", event.count.to_string())
        .env("HEARTH_SCALE_WORKERS", event.workers.to_string())
        .env("HEARTH_SCALE_TARGET", event.target_workers.to_string())
        .env("HEARTH_SCALE_REMOVE", remove.join(","))
        .env("HEARTH_SCALE_REASON", &event.reason)
        .env("HEARTH_SCALE_EVENT", String::from_utf8_lossy(json).as_ref())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(CommandError::Spawn)?;
    let out = child.stdout.take().map(|r| tokio::spawn(read_bounded(r)));
    let err = child.stderr.take().map(|r| tokio::spawn(read_bounded(r)));
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(s) => s.map_err(CommandError::Wait)?,
        Err(_) => {
            let _ = child.kill().await;
            return Err(CommandError::TimedOut(timeout));
        }
    };
    for (name, reader) in [("stdout", out), ("stderr", err)] {
        let Some(mut reader) = reader else { continue };
        match tokio::time::timeout(OUTPUT_GRACE, &mut reader).await {
            Ok(Ok(text)) if !text.is_empty() => {
                tracing::info!(stream = name, output = %text, "autoscale command output");
            }
            Ok(_) => {}
            Err(_) => reader.abort(),
        }
    }
    if status.success() {
        Ok(())
    } else {
        Err(CommandError::Exit(status))
    }
}

/// Reads a pipe to its end, keeping the first [`MAX_LOGGED_OUTPUT`] bytes and discarding the
/// rest (so a chatty command never blocks on a full pipe).
async fn read_bounded(mut r: impl tokio::io::AsyncRead + Unpin) -> String {
    let mut kept = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = MAX_LOGGED_OUTPUT.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> ScaleEvent {
        ScaleEvent {
            direction: Direction::In,
            count: 1,
            workers: 3,
            target_workers: 2,
            remove: vec![RemovedWorker {
                worker: "w3".into(),
                url: "http://127.0.0.1:9".into(),
            }],
            reason: "every worker under the scale-in load".into(),
            mean_load: 0.1,
            overloaded: 0,
        }
    }

    #[test]
    fn config_needs_an_action_and_bounded_keys() {
        let ok = AutoscaleConfig {
            command: vec!["/bin/true".into()],
            ..AutoscaleConfig::default()
        };
        assert_eq!(ok.check(), Ok(()));
        let bad = [
            (AutoscaleConfig::default(), "command or a webhook"),
            (
                AutoscaleConfig {
                    command: vec![" ".into()],
                    ..AutoscaleConfig::default()
                },
                "program",
            ),
            (
                AutoscaleConfig {
                    webhook: Some("ftp://x".into()),
                    ..AutoscaleConfig::default()
                },
                "webhook",
            ),
            (
                AutoscaleConfig {
                    interval_ms: 1,
                    ..ok.clone()
                },
                "interval_ms",
            ),
            (
                AutoscaleConfig {
                    action_timeout_ms: 10_000_000,
                    ..ok.clone()
                },
                "action_timeout_ms",
            ),
            (
                AutoscaleConfig {
                    command: vec!["x".into(); MAX_ARGS + 1],
                    ..AutoscaleConfig::default()
                },
                "arguments",
            ),
            (
                AutoscaleConfig {
                    params: AutoscaleParams {
                        min_workers: 9,
                        max_workers: 2,
                        ..AutoscaleParams::default()
                    },
                    ..ok.clone()
                },
                "min_workers",
            ),
        ];
        for (c, needle) in bad {
            let e = c.check().unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[tokio::test]
    async fn the_command_gets_the_decision_and_a_slow_one_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("seen");
        let script = format!(
            "printf '%s %s %s %s' \"$HEARTH_SCALE_DIRECTION\" \"$HEARTH_SCALE_COUNT\" \
             \"$HEARTH_SCALE_REMOVE\" \"$HEARTH_SCALE_TARGET\" > '{}'; \
             printf '%s' \"$HEARTH_SCALE_EVENT\" > '{}.json'",
            out.display(),
            out.display()
        );
        let e = event();
        let json = serde_json::to_vec(&e).unwrap();
        let argv = vec!["/bin/sh".to_string(), "-c".into(), script];
        run_command(&argv, &e, &json, Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "in 1 w3 2");
        let back: ScaleEvent =
            serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
                .unwrap();
        assert_eq!(back, e);
        let fails = vec!["/bin/sh".to_string(), "-c".into(), "exit 3".into()];
        assert!(matches!(
            run_command(&fails, &e, &json, Duration::from_secs(20)).await,
            Err(CommandError::Exit(_))
        ));
        let slow = vec!["/bin/sh".to_string(), "-c".into(), "sleep 30".into()];
        assert!(matches!(
            run_command(&slow, &e, &json, Duration::from_millis(200)).await,
            Err(CommandError::TimedOut(_))
        ));
    }

    #[tokio::test]
    async fn the_webhook_gets_the_decision_as_json_without_the_cluster_credential() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/scale", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            // Head and a body of the declared length.
            loop {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap();
                    if body.len() >= len {
                        break;
                    }
                }
            }
            s.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8(got).unwrap()
        });
        let tls = hearth_service::serving::load_client_tls("tls_ca", None)
            .await
            .unwrap();
        let hook = Forwarder::new(Duration::from_secs(5), None, tls).with_max_answer_bytes(0);
        let config = AutoscaleConfig {
            webhook: Some(url),
            ..AutoscaleConfig::default()
        };
        act(&config, &event(), &hook).await;
        let request = server.await.unwrap();
        assert!(request.starts_with("POST /scale HTTP/1.1"), "{request}");
        assert!(!request.to_ascii_lowercase().contains("authorization"));
        let body = request.split_once("\r\n\r\n").unwrap().1;
        let back: ScaleEvent = serde_json::from_str(body).unwrap();
        assert_eq!(back, event());
    }

    #[tokio::test]
    async fn chatty_output_is_kept_bounded() {
        let (mut w, r) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for _ in 0..100 {
                w.write_all(&[b'x'; 1000]).await.unwrap();
            }
        });
        let text = read_bounded(r).await;
        writer.await.unwrap();
        assert_eq!(text.len(), MAX_LOGGED_OUTPUT);
    }
}
