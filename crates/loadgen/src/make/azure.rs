//! Reading the Azure Functions 2019 trace files (per-minute invocation counts, duration and
//! memory percentiles) in either layout of `../shared/traces/`: the in-vitro samples
//! (`N_inv.csv`, `N_run.csv`, `N_mem.csv`, memory per app) and Freyr's 60-minute extract
//! (`exp_sim_{invocation,duration,memory}_traces_0.csv`, memory per function).

use crate::error::{LoadgenError, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One function of the source trace.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceFunction {
    /// The trace's HashFunction.
    pub id: String,
    /// Invocations in each minute of the selected window.
    pub per_minute: Vec<u32>,
    /// Mean execution time (ms).
    pub avg_ms: f64,
    /// Longest execution time (ms); `max − avg` estimates the cold-start cost (thesis ch. 3.6).
    pub max_ms: f64,
    /// Mean allocated memory (MiB), when the memory file has the function.
    pub mem_mb: Option<f64>,
}

impl SourceFunction {
    pub fn invocations(&self) -> u64 {
        self.per_minute.iter().map(|&c| u64::from(c)).sum()
    }
}

/// The three files of one sample.
#[derive(Debug, Clone)]
pub struct AzureFiles {
    pub invocations: PathBuf,
    pub durations: PathBuf,
    pub memory: PathBuf,
}

impl AzureFiles {
    /// The duration and memory files beside an invocation file, by the naming of either layout.
    pub fn beside(invocations: &Path) -> Result<Self> {
        let name = invocations
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let (durations, memory) = if name.contains("invocation") {
            (
                name.replace("invocation", "duration"),
                name.replace("invocation", "memory"),
            )
        } else if name.contains("_inv") {
            (name.replace("_inv", "_run"), name.replace("_inv", "_mem"))
        } else {
            return Err(LoadgenError::file(
                invocations,
                "cannot tell the duration and memory files from this name: give --durations and --memory",
            ));
        };
        Ok(AzureFiles {
            invocations: invocations.to_path_buf(),
            durations: invocations.with_file_name(durations),
            memory: invocations.with_file_name(memory),
        })
    }
}

fn reader(path: &Path) -> Result<(csv::Reader<std::fs::File>, csv::StringRecord)> {
    let f = std::fs::File::open(path).map_err(|e| LoadgenError::io(path, e))?;
    let mut r = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(f);
    let h = r.headers().map_err(|e| LoadgenError::csv(path, e))?.clone();
    Ok((r, h))
}

fn column(path: &Path, headers: &csv::StringRecord, name: &str, kind: &str) -> Result<usize> {
    headers.iter().position(|h| h == name).ok_or_else(|| {
        LoadgenError::file(
            path,
            format!("not an Azure {kind} file: no `{name}` column"),
        )
    })
}

fn number(path: &Path, rec: &csv::StringRecord, i: usize, what: &str) -> Result<f64> {
    let line = rec.position().map_or(0, |p| p.line());
    let text = rec.get(i).unwrap_or("");
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| {
            LoadgenError::invalid(
                path,
                line,
                format!("{what}: not a non-negative number: {text:?}"),
            )
        })
}

/// One row of an invocations file: HashFunction, HashApp (when present), per-minute counts.
type CountsRow = (String, Option<String>, Vec<u32>);

/// Per-minute counts of each function, `HashFunction` then `minute_N` (or `N`) columns, cut to
/// `minutes` starting at `from_minute`. Also returns each function's HashApp when present.
fn read_invocations(path: &Path, from_minute: usize, minutes: usize) -> Result<Vec<CountsRow>> {
    let (mut r, h) = reader(path)?;
    let id = column(path, &h, "HashFunction", "invocations")?;
    let app = h.iter().position(|c| c == "HashApp");
    let minute_cols: Vec<usize> = h
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            let n = c.strip_prefix("minute_").unwrap_or(c);
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
        })
        .map(|(i, _)| i)
        .collect();
    if minute_cols.is_empty() {
        return Err(LoadgenError::file(
            path,
            "not an Azure invocations file: no per-minute columns (minute_1… or 1…)",
        ));
    }
    if from_minute >= minute_cols.len() {
        return Err(LoadgenError::file(
            path,
            format!(
                "the trace has {} minutes; --from-minute {from_minute} is past its end",
                minute_cols.len()
            ),
        ));
    }
    let window = &minute_cols[from_minute..(from_minute + minutes).min(minute_cols.len())];
    let mut out = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| LoadgenError::csv(path, e))?;
        let line = rec.position().map_or(0, |p| p.line());
        let mut counts = Vec::with_capacity(window.len());
        for &i in window {
            let text = rec.get(i).unwrap_or("");
            counts.push(text.parse::<u32>().map_err(|_| {
                LoadgenError::invalid(
                    path,
                    line,
                    format!("column {}: not an invocation count: {text:?}", i + 1),
                )
            })?);
        }
        out.push((
            rec.get(id).unwrap_or("").to_string(),
            app.and_then(|a| rec.get(a)).map(str::to_string),
            counts,
        ));
    }
    Ok(out)
}

/// `HashFunction → (Average, Maximum)` in ms.
fn read_durations(path: &Path) -> Result<HashMap<String, (f64, f64)>> {
    let (mut r, h) = reader(path)?;
    let id = column(path, &h, "HashFunction", "durations")?;
    let avg = column(path, &h, "Average", "durations")?;
    let max = column(path, &h, "Maximum", "durations")?;
    let mut out = HashMap::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| LoadgenError::csv(path, e))?;
        let a = number(path, &rec, avg, "Average")?;
        let m = number(path, &rec, max, "Maximum")?;
        out.entry(rec.get(id).unwrap_or("").to_string())
            .or_insert((a, m.max(a)));
    }
    Ok(out)
}

/// Mean allocated memory (MiB), keyed by HashFunction when the file has it, else by HashApp.
fn read_memory(path: &Path) -> Result<(HashMap<String, f64>, bool)> {
    let (mut r, h) = reader(path)?;
    let by_function = h.iter().any(|c| c == "HashFunction");
    let key = column(
        path,
        &h,
        if by_function {
            "HashFunction"
        } else {
            "HashApp"
        },
        "memory",
    )?;
    let mem = column(path, &h, "AverageAllocatedMb", "memory")?;
    let mut out = HashMap::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| LoadgenError::csv(path, e))?;
        let v = number(path, &rec, mem, "AverageAllocatedMb")?;
        out.entry(rec.get(key).unwrap_or("").to_string())
            .or_insert(v);
    }
    Ok((out, by_function))
}

/// The functions of the window, joined with their durations and memory. Functions without a
/// duration row are left out (counted in the returned note).
pub fn read(
    files: &AzureFiles,
    from_minute: usize,
    minutes: usize,
) -> Result<(Vec<SourceFunction>, Vec<String>)> {
    let inv = read_invocations(&files.invocations, from_minute, minutes)?;
    let durations = read_durations(&files.durations)?;
    let (memory, by_function) = read_memory(&files.memory)?;
    let mut notes = Vec::new();
    let (mut no_duration, mut no_memory) = (0, 0);
    let mut out = Vec::new();
    for (id, app, per_minute) in inv {
        let Some(&(avg_ms, max_ms)) = durations.get(&id) else {
            no_duration += 1;
            continue;
        };
        let mem_key = if by_function { Some(&id) } else { app.as_ref() };
        let mem_mb = mem_key.and_then(|k| memory.get(k)).copied();
        if mem_mb.is_none() {
            no_memory += 1;
        }
        out.push(SourceFunction {
            id,
            per_minute,
            avg_ms,
            max_ms,
            mem_mb,
        });
    }
    if no_duration > 0 {
        notes.push(format!(
            "{no_duration} functions have no duration row and were left out"
        ));
    }
    if no_memory > 0 {
        notes.push(format!(
            "{no_memory} functions have no memory row: they get the default memory"
        ));
    }
    if out.is_empty() {
        return Err(LoadgenError::file(
            &files.invocations,
            "no function of this file has a duration row",
        ));
    }
    Ok((out, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn companion_files_follow_either_layout() {
        let f = AzureFiles::beside(Path::new("d/100_inv.csv")).unwrap();
        assert_eq!(f.durations, Path::new("d/100_run.csv"));
        assert_eq!(f.memory, Path::new("d/100_mem.csv"));
        let f = AzureFiles::beside(Path::new("d/exp_sim_invocation_traces_0.csv")).unwrap();
        assert_eq!(f.durations, Path::new("d/exp_sim_duration_traces_0.csv"));
        assert_eq!(f.memory, Path::new("d/exp_sim_memory_traces_0.csv"));
        assert!(AzureFiles::beside(Path::new("d/trace.csv")).is_err());
    }

    #[test]
    fn freyr_layout_reads_minutes_and_per_function_memory() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("inv.csv"),
            "HashFunction,Trigger,1,2,3\n0,timer,1,0,1\n1,http,x,2,0\n",
        )
        .unwrap();
        std::fs::write(
            d.join("dur.csv"),
            "HashFunction,Average,Count,Minimum,Maximum\n0,336,287,23.0,4084.0\n",
        )
        .unwrap();
        std::fs::write(
            d.join("mem.csv"),
            "HashFunction,SampleCount,AverageAllocatedMb\n0,20985,189\n",
        )
        .unwrap();
        let files = AzureFiles {
            invocations: d.join("inv.csv"),
            durations: d.join("dur.csv"),
            memory: d.join("mem.csv"),
        };
        let err = read(&files, 0, 3).unwrap_err().to_string();
        assert!(
            err.contains("inv.csv, line 3") && err.contains("\"x\""),
            "{err}"
        );
        let (fns, notes) = read(&files, 1, 2).unwrap();
        // Function 1 has no duration row; the window starts at the second minute.
        assert_eq!(fns.len(), 1);
        assert_eq!(fns[0].per_minute, vec![0, 1]);
        assert_eq!(
            (fns[0].avg_ms, fns[0].max_ms, fns[0].mem_mb),
            (336.0, 4084.0, Some(189.0))
        );
        assert!(
            notes[0].contains("1 functions have no duration row"),
            "{notes:?}"
        );
        let err = read(&files, 3, 1).unwrap_err().to_string();
        assert!(err.contains("past its end"), "{err}");
    }
}
