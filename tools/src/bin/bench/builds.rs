//! The filters the bench builds or derives besides tollgate.wasm itself: the wasm floor, the filter of
//! issue 17's baseline (from this clone's history) and tollgate.wasm without its body callback. A
//! scenario whose filter cannot be had is left out with a warning, never run on the wrong build.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tollgate_e2e as common;

use common::repo_root;

use crate::exports::{export_names, rename_export};
use crate::scenarios::{Def, Setup};

/// Issue 17's baseline code: main when the issue was filed (the last commit before Engine v2).
/// tollgate-exact-baseline runs the filter built from it, so that the "0.5× today's" is a
/// ratio of two builds measured in the same slices.
pub const BASELINE_COMMIT: &str = "a22f9510c876d91edd8effccfcd210792b4509bd";

/// The callback tollgate.wasm exports so that `usage.body_field` rules work, for every request.
pub const BODY_CALLBACK: &str = "proxy_on_response_body";
/// Its name in tollgate-lease-no-body-export's copy: as long, and unknown to Envoy.
pub const BODY_CALLBACK_RENAMED: &str = "proxy_on_response_bodx";

/// The filters built for the bench besides tollgate's own (an empty path when no scenario runs it).
#[derive(Debug, Default)]
pub struct Builds {
    /// bench/wasm-floor.
    pub floor: PathBuf,
    /// tollgate at `BASELINE_COMMIT`.
    pub baseline: PathBuf,
    /// tollgate.wasm with [`BODY_CALLBACK`] renamed.
    pub body_unexported: PathBuf,
}

impl Builds {
    /// Builds what the scenarios of `defs` run; drops from `defs` a scenario whose filter could
    /// not be had (with a warning). Fails only if the wasm floor does not build.
    pub fn prepare(defs: &mut Vec<Def>, tollgate: &Path) -> Result<Builds, String> {
        let mut builds = Builds::default();
        let runs = |defs: &[Def], f: fn(&Setup) -> bool| defs.iter().any(|d| f(&d.setup));
        if runs(
            defs,
            |s| matches!(s, Setup::Template(t) if t.starts_with("wasm-floor")),
        ) {
            eprintln!("bench: building bench/wasm-floor");
            builds.floor = common::build_wasm_floor()?;
        }
        if runs(defs, |s| *s == Setup::Baseline) {
            eprintln!("bench: building the baseline filter ({BASELINE_COMMIT}: before the engine's rewrite)");
            match build_baseline() {
                Ok(path) => builds.baseline = path,
                Err(e) => leave_out(defs, Setup::Baseline, &e),
            }
        }
        if runs(defs, |s| *s == Setup::BodyUnexported) {
            match body_unexported(tollgate) {
                Ok(path) => builds.body_unexported = path,
                Err(e) => leave_out(defs, Setup::BodyUnexported, &e),
            }
        }
        Ok(builds)
    }
}

/// Drops the scenarios of `setup` from `defs`, saying why.
fn leave_out(defs: &mut Vec<Def>, setup: Setup, why: &str) {
    let names: Vec<&str> = defs
        .iter()
        .filter(|d| d.setup == setup)
        .map(|d| d.name)
        .collect();
    eprintln!("bench: warning: {} left out: {why}", names.join(", "));
    defs.retain(|d| d.setup != setup);
}

/// Writes a copy of `tollgate` (tollgate.wasm) whose [`BODY_CALLBACK`] export is named
/// [`BODY_CALLBACK_RENAMED`], beside the bench's reports, and returns its path.
fn body_unexported(tollgate: &Path) -> Result<PathBuf, String> {
    let module =
        std::fs::read(tollgate).map_err(|e| format!("read {}: {e}", tollgate.display()))?;
    let copy = rename_export(&module, BODY_CALLBACK, BODY_CALLBACK_RENAMED)
        .map_err(|e| format!("{}: {e}", tollgate.display()))?;
    // What Envoy will look up: the callback must be gone, every other export still there.
    let (before, after) = (export_names(&module), export_names(&copy));
    let kept = |names: &[String]| -> Vec<String> {
        names
            .iter()
            .filter(|n| *n != BODY_CALLBACK && *n != BODY_CALLBACK_RENAMED)
            .cloned()
            .collect()
    };
    match (before, after) {
        (Ok(b), Ok(a)) if !a.iter().any(|n| n == BODY_CALLBACK) && kept(&a) == kept(&b) => {}
        _ => return Err(format!("renaming {BODY_CALLBACK} changed more than that")),
    }
    let dir = repo_root().join("target/bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let path = dir.join("tollgate-no-body-export.wasm");
    std::fs::write(&path, copy).map_err(|e| format!("write {}: {e}", path.display()))?;
    Ok(path)
}

/// Builds tollgate as it was at `BASELINE_COMMIT`, from this clone's history (a shallow clone may
/// not have it), into target/bench/baseline/. Its Cargo.lock pins the crates it was built with.
fn build_baseline() -> Result<PathBuf, String> {
    let root = repo_root();
    let dir = root.join("target/bench/baseline");
    let src = dir.join(&BASELINE_COMMIT[..12]);
    if !src.join("Cargo.toml").is_file() {
        let unpacking = dir.join("unpacking");
        let _ = std::fs::remove_dir_all(&unpacking);
        std::fs::create_dir_all(&unpacking)
            .map_err(|e| format!("create {}: {e}", unpacking.display()))?;
        let tar = unpacking.join("source.tar");
        let archived = Command::new("git")
            .current_dir(&root)
            .args(["archive", "--format=tar", "-o"])
            .arg(&tar)
            .arg(BASELINE_COMMIT)
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("run git: {e}"))?;
        if !archived.success() {
            return Err(format!("this clone does not have commit {BASELINE_COMMIT}"));
        }
        let unpacked = Command::new("tar")
            .arg("-xf")
            .arg(&tar)
            .arg("-C")
            .arg(&unpacking)
            .status()
            .map_err(|e| format!("run tar: {e}"))?;
        if !unpacked.success() {
            return Err(format!("unpacking {} failed ({unpacked})", tar.display()));
        }
        // The source sits inside this repository's workspace: an empty [workspace] table makes it
        // a workspace of its own, as it was in its own checkout.
        let manifest = unpacking.join("Cargo.toml");
        let mut text = std::fs::read_to_string(&manifest)
            .map_err(|e| format!("read {}: {e}", manifest.display()))?;
        if !text.contains("\n[workspace]") {
            text.push_str("\n[workspace]\n");
        }
        std::fs::write(&manifest, text)
            .map_err(|e| format!("write {}: {e}", manifest.display()))?;
        std::fs::remove_file(&tar).map_err(|e| format!("remove {}: {e}", tar.display()))?;
        std::fs::rename(&unpacking, &src)
            .map_err(|e| format!("rename to {}: {e}", src.display()))?;
    }
    common::build_wasm(&src.join("Cargo.toml"), &dir.join("target"), "tollgate")
}
