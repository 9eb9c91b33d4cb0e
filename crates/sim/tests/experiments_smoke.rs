//! Every experiment runs end to end in `--quick` mode on a small made-up Azure sample (in the
//! in-vitro layout), writes its table and figures, and does not depend on the thread count.

use hearth_sim::experiments::{run, Experiment, Options};
use std::fmt::Write;
use std::path::{Path, PathBuf};

const FUNCTIONS: usize = 60;
const MINUTES: usize = 150;

/// `ROOT/azure2019-invitro-sample/1350_{inv,run,mem}.csv`: ten busy functions, twenty
/// periodic ones, thirty rare ones.
fn fake_traces(root: &Path) -> PathBuf {
    let dir = root.join("azure2019-invitro-sample");
    std::fs::create_dir_all(&dir).unwrap();
    let mut inv = String::from("HashFunction,HashOwner,HashApp");
    for m in 1..=MINUTES {
        let _ = write!(inv, ",minute_{m}");
    }
    inv.push('\n');
    let mut run = String::from("HashOwner,HashApp,HashFunction,Average,Count,Minimum,Maximum\n");
    let mut mem = String::from("HashOwner,HashApp,SampleCount,AverageAllocatedMb\n");
    for i in 0..FUNCTIONS {
        let id = format!("{i:04x}feedbeef");
        let _ = write!(inv, "{id},{id},{id}");
        for m in 0..MINUTES {
            let n = if i < 10 {
                2 + (m * 7 + i) % 5
            } else if i < 30 {
                usize::from((m + i) % 4 == 0) * 2
            } else {
                usize::from((m * i) % 37 == 0)
            };
            let _ = write!(inv, ",{n}");
        }
        inv.push('\n');
        let avg = 5.0 * ((1 + i % 8) * (1 + i % 8)) as f64;
        let _ = writeln!(run, "{id},{id},{id},{avg},10,1.0,{}", avg * 4.0 + 100.0);
        let _ = writeln!(mem, "{id},{id},10,{}", 64 + (i % 5) * 64);
    }
    std::fs::write(dir.join("1350_inv.csv"), inv).unwrap();
    std::fs::write(dir.join("1350_run.csv"), run).unwrap();
    std::fs::write(dir.join("1350_mem.csv"), mem).unwrap();
    root.to_path_buf()
}

fn options(traces: &Path, out: PathBuf, jobs: usize) -> Options {
    Options {
        traces: traces.to_path_buf(),
        out,
        quick: true,
        jobs,
        seed: 1,
        server: hearth_sim::Server::Ps,
    }
}

#[test]
fn every_experiment_writes_its_table_and_figures() {
    let dir = tempfile::tempdir().unwrap();
    let traces = fake_traces(&dir.path().join("traces"));
    for e in Experiment::ALL {
        let out = dir.path().join(e.name());
        let report = run(e, &options(&traces, out.clone(), 2)).unwrap();
        assert!(
            report.markdown.starts_with(&format!("# {}", e.name())),
            "{}",
            report.markdown
        );
        assert!(report.markdown.contains("| ---"), "a table");
        let pngs: Vec<&PathBuf> = report
            .files
            .iter()
            .filter(|f| f.extension().is_some_and(|x| x == "png"))
            .collect();
        assert!(!pngs.is_empty(), "{e:?} wrote no figure");
        for f in &report.files {
            assert!(std::fs::metadata(f).unwrap().len() > 0, "{}", f.display());
        }
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap())
                .unwrap();
        assert_eq!(json["experiment"], e.name());
        if e == Experiment::Atoll {
            check_atoll(&json);
        }
        if e == Experiment::Alps {
            check_alps(&json);
        }
        if e == Experiment::Queue {
            check_queue(&json);
        }
        if e == Experiment::Scaling {
            check_scaling(&json, &report.files);
        }
    }
}

/// Atoll's JSON has every rung on every workload, every overhead, and both sides of the
/// eviction and scale-out studies, each with its numbers.
fn check_atoll(json: &serde_json::Value) {
    let ladder = json["ladder"].as_array().unwrap();
    let workloads: Vec<u64> = ladder
        .iter()
        .map(|w| w["workload"].as_u64().unwrap())
        .collect();
    assert_eq!(workloads, [1, 2, 3]);
    for w in ladder {
        let rungs: Vec<&str> = w["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["rung"].as_str().unwrap())
            .collect();
        assert_eq!(rungs, ["gfr", "gdr", "gdpi", "atoll", "d-atoll"]);
        for r in w["runs"].as_array().unwrap() {
            assert!(r["invocations"].as_u64().unwrap() > 0, "{r}");
            assert!(r["missed_pct"].as_f64().is_some(), "{r}");
            assert!(r["p999_ms"].as_f64().unwrap() > 0.0, "{r}");
        }
        if w["workload"] != 3 {
            let classes = w["runs"][0]["missed_pct_by_class"].as_object().unwrap();
            let names: Vec<&String> = classes.keys().collect();
            assert_eq!(names, ["C1", "C2", "C3", "C4"]);
        }
    }
    let overheads: Vec<u64> = json["overhead"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["overhead_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(overheads, [100, 50, 10, 1]);
    for (study, a, b) in [
        ("eviction", "fair", "lru"),
        ("scale_out", "gradual", "instant"),
    ] {
        for side in [a, b] {
            assert!(
                json[study][side]["invocations"].as_u64().unwrap() > 0,
                "{study} {side}"
            );
        }
    }
}

/// Scaling's JSON has Fig. 9 open and closed loop (the matched and the paper's client counts)
/// for every policy, each with the invocations its clients made and the CPU load they offered,
/// and Fig. 11 both ways with its closed-loop figure.
fn check_scaling(json: &serde_json::Value, files: &[PathBuf]) {
    let names = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| p["policy"].as_str().unwrap().to_string())
            .collect()
    };
    let open = names(&json["fig9"]["policies"]);
    assert_eq!(open.len(), 5);
    let closed = json["fig9_closed"].as_array().unwrap();
    assert_eq!(closed.len(), 2);
    for c in closed {
        assert!(c["clients"].as_u64().unwrap() > 0, "{c}");
        assert_eq!(names(&c["policies"]), open);
        for p in c["policies"].as_array().unwrap() {
            assert!(p["invocations"].as_u64().unwrap() > 0, "{p}");
            let load = p["cpu_load"].as_f64().unwrap();
            assert!(load > 0.0 && load <= 1.0 + 1e-9, "{p}");
        }
    }
    check_scaling_memory(&json["fig9_memory"], &open);
    for fig in ["fig11", "fig11_closed"] {
        assert_eq!(json[fig]["runs"].as_array().unwrap().len(), 4, "{fig}");
    }
    assert!(files
        .iter()
        .any(|f| f.ends_with("scaling_autoscale_closed.png")));
}

/// Fig. 9 by memory: every policy at the Fig. 9 size, then OW+GD, OW+TTL and CH-RLU at a size
/// below the measured distinct sandbox memory per worker, each with its evictions and cold
/// starts by reason; less memory evicts more, and GDSF never lets a keep-alive window expire.
fn check_scaling_memory(mem: &serde_json::Value, open: &[String]) {
    let sizes: Vec<u64> = mem["sizes_mb"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(sizes.len(), 2, "{mem}");
    let (full, scarce) = (sizes[0], sizes[1]);
    let demand = mem["demand_mb"].as_u64().unwrap();
    assert!(scarce < demand && scarce < full && scarce >= 1024, "{mem}");
    let distinct = mem["distinct_mb_per_worker"].as_array().unwrap();
    assert_eq!(distinct.len(), 4, "the quick cluster's workers");
    let runs = mem["runs"].as_array().unwrap();
    let at = |mb: u64| -> Vec<&serde_json::Value> {
        runs.iter()
            .filter(|r| r["memory_mb"].as_u64() == Some(mb))
            .collect()
    };
    let names = |rs: &[&serde_json::Value]| -> Vec<String> {
        rs.iter()
            .map(|r| r["policy"].as_str().unwrap().to_string())
            .collect()
    };
    let (f, sc) = (at(full), at(scarce));
    assert_eq!(f.len() + sc.len(), runs.len());
    assert_eq!(names(&f), open);
    assert_eq!(
        names(&sc),
        ["openwhisk (GDSF)", "openwhisk (TTL)", "ch-rlu"]
    );
    for r in runs {
        assert!(r["evictions"].as_u64().unwrap() > 0, "{r}");
        assert!(r["cold_ratio"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            r["peak_memory_mb"].as_u64().unwrap() <= r["memory_mb"].as_u64().unwrap(),
            "{r}"
        );
        if r["policy"] != "openwhisk (TTL)" {
            assert_eq!(r["cold_expired"], 0, "{r}");
        }
    }
    let evictions = |rs: &[&serde_json::Value]| rs[0]["evictions"].as_u64().unwrap();
    assert!(
        evictions(&sc) > evictions(&f),
        "OW+GD evicts more with less memory"
    );
}

/// ALPS' JSON has every scheduler on both workloads with durations and context switches,
/// the four ablation configurations and each sensitivity sweep.
fn check_alps(json: &serde_json::Value) {
    let runs = json["runs"].as_array().unwrap();
    for w in ["huawei-like", "azure-like"] {
        let scheds: Vec<&str> = runs
            .iter()
            .filter(|r| r["workload"] == w)
            .map(|r| r["scheduler"].as_str().unwrap())
            .collect();
        assert_eq!(scheds, ["cfs", "sfs", "alps", "srpt", "ps"], "{w}");
    }
    for r in runs {
        assert!(r["n"].as_u64().unwrap() > 0, "{r}");
        assert!(r["mean_ms"].as_f64().unwrap() > 0.0, "{r}");
        let switches = r["context_switches"].as_u64().unwrap();
        assert_eq!(switches == 0, r["scheduler"] == "ps", "{r}");
    }
    assert_eq!(json["ablation"].as_array().unwrap().len(), 8);
    let params: std::collections::BTreeSet<&str> = json["sensitivity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["parameter"].as_str().unwrap())
        .collect();
    assert_eq!(params.len(), 5, "{params:?}");
    assert_eq!(json["headline"].as_array().unwrap().len(), 2);
}

/// The queue experiment states each load it ran at, as offered (the compression's target) and
/// as measured, keeps the pre-issue-17 point last and labelled, and names its headline load.
fn check_queue(json: &serde_json::Value) {
    let loads = json["loads"].as_array().unwrap();
    let targets: Vec<f64> = loads
        .iter()
        .map(|l| l["target"].as_f64().unwrap())
        .collect();
    assert_eq!(targets, [0.5, 0.8, 14.0 / 16.0]);
    for (i, l) in loads.iter().enumerate() {
        assert_eq!(l["thesis_point"], i == loads.len() - 1, "{l}");
        let offered = &l["stationary"];
        let mean = offered["mean"].as_f64().unwrap();
        assert!((mean - targets[i]).abs() < 0.01, "{l}");
        let (p95, max) = (
            offered["p95"].as_f64().unwrap(),
            offered["max"].as_f64().unwrap(),
        );
        assert!(offered["p50"].as_f64().unwrap() <= p95 && p95 <= max, "{l}");
        let busy = l["busy_eedf_limit_16"].as_f64().unwrap();
        assert!(busy > 0.0 && busy <= 1.0 + 1e-9, "{l}");
    }
    let headline = json["headline"]["load"].as_f64().unwrap();
    assert!(
        [0.5, 0.8].iter().any(|t| (headline - t).abs() < 0.01),
        "the headline is one of the regular loads: {headline}"
    );
    for r in json["runs"].as_array().unwrap() {
        if let Some(m) = r["missed_deadlines"].as_f64() {
            assert!((0.0..=1.0).contains(&m), "{r}");
        }
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let traces = fake_traces(&dir.path().join("traces"));
    let one = run(
        Experiment::Queue,
        &options(&traces, dir.path().join("one"), 1),
    )
    .unwrap();
    let two = run(
        Experiment::Queue,
        &options(&traces, dir.path().join("two"), 2),
    )
    .unwrap();
    assert_eq!(one.markdown, two.markdown);
    let read = |d: &str| std::fs::read(dir.path().join(d).join("results.json")).unwrap();
    assert_eq!(read("one"), read("two"));
}

/// `--server contention` reaches every worker of the scaling experiment (Figs. 9–11 change,
/// the report says which model ran), and an experiment that models its servers its own way
/// refuses it rather than printing a header for a model it did not use.
#[test]
fn the_server_model_reaches_scaling_and_is_refused_where_it_does_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    let traces = fake_traces(&dir.path().join("traces"));
    let slowdowns = |json: &serde_json::Value, fig: &str| -> Vec<f64> {
        json[fig]["policies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["global_slowdown"].as_f64().unwrap())
            .collect()
    };
    let mut by_server = Vec::new();
    for (name, server) in [
        ("ps", hearth_sim::Server::Ps),
        (
            "contention",
            hearth_sim::Server::Contention(hearth_sim::Contention::default()),
        ),
    ] {
        let out = dir.path().join(format!("scaling-{name}"));
        let mut o = options(&traces, out.clone(), 2);
        o.server = server;
        let report = run(Experiment::Scaling, &o).unwrap();
        assert_eq!(
            report.markdown.starts_with("Server model: **contention**"),
            name == "contention",
            "{}",
            &report.markdown[..200.min(report.markdown.len())]
        );
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap())
                .unwrap();
        check_scaling(&json, &report.files);
        by_server.push(json);
    }
    let (ps, contention) = (&by_server[0], &by_server[1]);
    for fig in ["fig9", "fig10"] {
        let (a, b) = (slowdowns(ps, fig), slowdowns(contention, fig));
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        assert!(
            a.iter().zip(&b).all(|(a, b)| a != b) && mean(&b) > mean(&a),
            "{fig}: the contention server changes every policy's run, and interference and \
             costly creations slow them on the whole: ps {a:?}, contention {b:?}"
        );
    }
    for e in Experiment::ALL {
        let mut o = options(&traces, dir.path().join(format!("{}-c", e.name())), 1);
        o.server = hearth_sim::Server::Contention(hearth_sim::Contention::default());
        if e.takes_server() {
            continue;
        }
        let err = run(e, &o).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "experiment {} keeps its own server model",
                e.name()
            )) && err.contains("scaling"),
            "{err}"
        );
    }
}
