//! `hearth runtime …`: the host's runtime images (docs/runtimes.md). They live in a store on
//! the host, shared by every worker there, so these commands work on the store directly, with
//! no server running: `scripts/setup.sh` builds the default runtime before anything starts.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use hearth_worker::runtimes::{
    RuntimeStore, DEFAULT_MIRROR, DEFAULT_RUNTIME, DEFAULT_STORE_DIR, DEFAULT_SUITE,
};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct StoreArg {
    /// The runtime store (the workers' `runtime.store_dir`).
    #[arg(long, env = "HEARTH_RUNTIME_STORE_DIR", default_value = DEFAULT_STORE_DIR)]
    pub store: PathBuf,
}

#[derive(Subcommand, Debug)]
pub enum RuntimeCommand {
    /// List the runtimes: name, digest, size, source.
    List {
        #[command(flatten)]
        store: StoreArg,
    },
    /// Build a Python runtime from Debian's packages with mmdebstrap (as root; ~25 s).
    Build {
        #[arg(default_value = DEFAULT_RUNTIME)]
        name: String,
        /// The Debian release (bookworm's python3 is 3.11).
        #[arg(long, default_value = DEFAULT_SUITE)]
        suite: String,
        #[arg(long, default_value = DEFAULT_MIRROR)]
        mirror: String,
        /// Build only when no runtime of this name exists yet.
        #[arg(long)]
        if_missing: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Import an OCI image archive (`skopeo copy … oci-archive:FILE:TAG`) as a runtime.
    Import {
        name: String,
        archive: PathBuf,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Remove a runtime name (and its image when no other name points at it). Workers refuse
    /// to start functions whose image is gone, so remove only what no function uses.
    Rm {
        name: String,
        #[command(flatten)]
        store: StoreArg,
    },
}

pub fn run(cmd: RuntimeCommand) -> Result<()> {
    match cmd {
        RuntimeCommand::List { store } => {
            let s = RuntimeStore::new(store.store);
            for rt in s.list() {
                println!(
                    "{:<16} {}  {:>6.1} MB  {}",
                    rt.name,
                    rt.digest,
                    rt.bytes as f64 / 1e6,
                    rt.source
                );
            }
            Ok(())
        }
        RuntimeCommand::Build {
            name,
            suite,
            mirror,
            if_missing,
            store,
        } => {
            let s = RuntimeStore::new(store.store);
            if if_missing {
                if let Some(rt) = s.resolve(&name) {
                    println!("{} {} (already built)", name, rt.digest);
                    return Ok(());
                }
            }
            let t = std::time::Instant::now();
            let rt = s
                .build(&name, &suite, &mirror)
                .with_context(|| format!("building runtime {name}"))?;
            println!(
                "{} {}  {:.1} MB in {:.1} s",
                rt.name,
                rt.digest,
                rt.bytes as f64 / 1e6,
                t.elapsed().as_secs_f64()
            );
            Ok(())
        }
        RuntimeCommand::Import {
            name,
            archive,
            store,
        } => {
            let s = RuntimeStore::new(store.store);
            let rt = s
                .import(&name, &archive)
                .with_context(|| format!("importing runtime {name}"))?;
            println!("{} {}  {:.1} MB", rt.name, rt.digest, rt.bytes as f64 / 1e6);
            Ok(())
        }
        RuntimeCommand::Rm { name, store } => {
            let s = RuntimeStore::new(store.store);
            s.remove(&name, &[])
                .with_context(|| format!("removing runtime {name}"))?;
            Ok(())
        }
    }
}
