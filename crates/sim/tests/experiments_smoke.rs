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
