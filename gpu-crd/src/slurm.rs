//! What the controller says to and reads from Slurm, without I/O: the batch script a spec
//! becomes, the shell script that uploads it and submits it with `sbatch --parsable`, the
//! `scontrol -o show job` record of a job, what each Slurm state means for the GPUJob's phase,
//! and the files fetched when it ends.

use crate::types::GPUJobSpec;
use base64::Engine;
use std::collections::BTreeMap;

/// The heredoc delimiter of uploaded files (base64 never contains it).
const EOF_MARK: &str = "MINIK8S_EOF";

/// The marker file the batch script leaves when the build fails.
pub const BUILD_FAILED: &str = "build.failed";

/// At most this much of stdout, stderr and the result goes into the status.
pub const STATUS_TAIL: usize = 32 * 1024;

/// At most this much of the result goes into the result ConfigMap.
pub const RESULT_LIMIT: usize = 1024 * 1024;

/// Quotes `s` for a POSIX shell.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Whether `name` may be a file of the job's folder.
pub fn valid_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The batch script of `spec`, run in `dir` under the job name `name`.
pub fn batch_script(spec: &GPUJobSpec, name: &str, dir: &str) -> String {
    let mut s = String::from("#!/bin/bash\n");
    let mut opt = |o: String| s.push_str(&format!("#SBATCH {o}\n"));
    opt(format!("--job-name={name}"));
    if let Some(p) = spec.partition.as_deref().filter(|p| !p.is_empty()) {
        opt(format!("--partition={p}"));
    }
    opt(format!("--nodes={}", spec.nodes));
    opt(format!("--ntasks-per-node={}", spec.tasks_per_node));
    opt(format!("--cpus-per-task={}", spec.cpus_per_task));
    if spec.gpus > 0 {
        opt(format!("--gres=gpu:{}", spec.gpus));
    }
    if let Some(t) = spec.time_limit.as_deref().filter(|t| !t.is_empty()) {
        opt(format!("--time={t}"));
    }
    opt(format!("--chdir={dir}"));
    opt(format!("--output={dir}/stdout"));
    opt(format!("--error={dir}/stderr"));
    for e in &spec.env {
        s.push_str(&format!("export {}={}\n", e.name, quote(&e.value)));
    }
    if let Some(build) = spec.build.as_deref().filter(|b| !b.trim().is_empty()) {
        s.push_str(&format!(
            "( {build}\n) > build.log 2>&1\nrc=$?\nif [ $rc -ne 0 ]; then echo $rc > {BUILD_FAILED}; cat build.log >&2; exit $rc; fi\n"
        ));
    }
    s.push_str(&spec.run);
    s.push('\n');
    s
}

/// The script (for `sh -s` on the login node) that writes `files` and the batch script into
/// `dir` and submits it; it prints the job id.
pub fn submit_script(dir: &str, files: &BTreeMap<String, Vec<u8>>, batch: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut s = format!("set -e\nmkdir -p {d}\ncd {d}\n", d = quote(dir));
    let mut put = |name: &str, data: &[u8]| {
        s.push_str(&format!(
            "base64 -d > {} <<'{EOF_MARK}'\n{}\n{EOF_MARK}\n",
            quote(name),
            b64.encode(data)
        ));
    };
    for (name, data) in files {
        put(name, data);
    }
    put("job.sh", batch.as_bytes());
    s.push_str("sbatch --parsable job.sh\n");
    s
}

/// The job id `sbatch --parsable` printed (`123` or `123;cluster`).
pub fn parse_job_id(out: &str) -> Option<String> {
    let line = out.lines().rev().find(|l| !l.trim().is_empty())?;
    let id = line.trim().split(';').next()?;
    id.chars()
        .all(|c| c.is_ascii_digit())
        .then(|| id.to_owned())
}

/// The fields of one `scontrol -o show job` record.
pub fn parse_record(line: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut key: Option<String> = None;
    for word in line.split_whitespace() {
        match word.split_once('=') {
            Some((k, v))
                if !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '/' || c == ':' || c == '_') =>
            {
                out.insert(k.to_owned(), v.to_owned());
                key = Some(k.to_owned());
            }
            // A value with spaces (a command or path): it continues the previous one.
            _ => {
                if let Some(k) = &key
                    && let Some(v) = out.get_mut(k)
                {
                    v.push(' ');
                    v.push_str(word);
                }
            }
        }
    }
    out
}

/// A Slurm job as the controller sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Job {
    /// `PENDING`, `RUNNING`, `COMPLETED`, … (the base state, without `+` flags).
    pub state: String,
    /// Slurm's reason (`Resources`, `Priority`, `None`, …).
    pub reason: String,
    /// The exit code and the signal that ended it.
    pub exit: (i32, i32),
    /// Submit, start and end times as Slurm prints them (local time).
    pub submit: Option<String>,
    /// When it started.
    pub start: Option<String>,
    /// When it ended.
    pub end: Option<String>,
}

impl Job {
    /// The job in an `scontrol -o show job` record.
    pub fn from_record(r: &BTreeMap<String, String>) -> Option<Job> {
        let state = r.get("JobState")?.split('+').next()?.to_owned();
        let exit = r
            .get("ExitCode")
            .and_then(|e| e.split_once(':'))
            .map(|(c, s)| (c.parse().unwrap_or(0), s.parse().unwrap_or(0)))
            .unwrap_or((0, 0));
        let time = |k: &str| {
            r.get(k)
                .filter(|t| !matches!(t.as_str(), "Unknown" | "None" | "N/A" | ""))
                .cloned()
        };
        Some(Job {
            state,
            reason: r.get("Reason").cloned().unwrap_or_default(),
            exit,
            submit: time("SubmitTime"),
            start: time("StartTime"),
            end: time("EndTime"),
        })
    }
}

/// A GPUJob's phase and reason for a Slurm state (every state Slurm reports).
pub fn phase_of(job: &Job) -> (&'static str, Option<String>) {
    let reason = |r: &str| Some(r.to_owned());
    match job.state.as_str() {
        "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD" => (
            "Queued",
            (!job.reason.is_empty() && job.reason != "None").then(|| job.reason.clone()),
        ),
        "CONFIGURING" | "RUNNING" | "COMPLETING" | "STAGE_OUT" | "SIGNALING" | "RESIZING" => {
            ("Running", None)
        }
        "SUSPENDED" | "STOPPED" => ("Running", reason(&job.state)),
        "COMPLETED" => ("Succeeded", None),
        "CANCELLED" => ("Cancelled", reason("CANCELLED")),
        "FAILED" => ("Failed", reason("Error")),
        "TIMEOUT" | "OUT_OF_MEMORY" | "NODE_FAIL" | "PREEMPTED" | "BOOT_FAIL" | "DEADLINE"
        | "REVOKED" | "SPECIAL_EXIT" => ("Failed", reason(&job.state)),
        _ => ("Running", reason(&job.state)),
    }
}

/// Whether Slurm is done with the job.
pub fn ended(job: &Job) -> bool {
    matches!(phase_of(job).0, "Succeeded" | "Failed" | "Cancelled")
}

/// The script that prints, for each of `files` in `dir`, `name size` and then (base64, on one
/// line) its last `tail` bytes, or `name -` if it is missing. The result file is read from
/// its start, up to one byte past the ConfigMap limit (so truncation shows).
pub fn fetch_script(dir: &str, files: &[(&str, usize, bool)]) -> String {
    let mut s = format!("cd {} || exit 0\n", quote(dir));
    for (name, limit, from_start) in files {
        let q = quote(name);
        let cut = if *from_start {
            format!("head -c {limit}")
        } else {
            format!("tail -c {limit}")
        };
        s.push_str(&format!(
            "if [ -f {q} ]; then printf '%s %s\\n' {q} \"$(wc -c < {q})\"; {cut} {q} | base64 -w0; echo; else printf '%s -\\n' {q}; fi\n"
        ));
    }
    s
}

/// A fetched file: its full size and the bytes fetched.
pub type Fetched = BTreeMap<String, (u64, Vec<u8>)>;

/// Parses [`fetch_script`]'s output.
pub fn parse_fetched(out: &str) -> Fetched {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut got = Fetched::new();
    let mut lines = out.lines();
    while let Some(head) = lines.next() {
        let Some((name, size)) = head.rsplit_once(' ') else {
            continue;
        };
        if size == "-" {
            continue;
        }
        let data = lines.next().unwrap_or("");
        let size = size.trim().parse().unwrap_or(0);
        got.insert(
            name.to_owned(),
            (size, b64.decode(data.trim()).unwrap_or_default()),
        );
    }
    got
}

/// The last `limit` bytes of `data` as text (lossy UTF-8, starting at a character boundary).
pub fn tail_text(data: &[u8], limit: usize) -> String {
    let start = data.len().saturating_sub(limit);
    let text = String::from_utf8_lossy(&data[start..]).into_owned();
    text.trim_start_matches('\u{FFFD}').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> GPUJobSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn the_seeds_job_becomes_a_batch_script() {
        let s = spec(
            "partition: gpu\nnodes: 1\ntasksPerNode: 1\ncpusPerTask: 6\ngpus: 1\ntimeLimit: '00:05:00'\nbuild: gcc add.c -o add\nrun: ./add\nresultFile: result\nenv: [{name: N, value: \"it's\"}]\n",
        );
        let script = batch_script(&s, "uid-1", "/jobs/uid-1");
        for line in [
            "#SBATCH --job-name=uid-1",
            "#SBATCH --partition=gpu",
            "#SBATCH --nodes=1",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --cpus-per-task=6",
            "#SBATCH --gres=gpu:1",
            "#SBATCH --time=00:05:00",
            "#SBATCH --output=/jobs/uid-1/stdout",
            "#SBATCH --error=/jobs/uid-1/stderr",
            r"export N='it'\''s'",
            "( gcc add.c -o add",
            "then echo $rc > build.failed",
            "./add",
        ] {
            assert!(script.contains(line), "{line}\n{script}");
        }
        let none = batch_script(&spec("run: ./x\n"), "u", "/d");
        assert!(
            !none.contains("--gres") && !none.contains("--partition") && !none.contains("build")
        );
    }

    #[test]
    fn submission_uploads_files_and_prints_the_id() {
        let files = BTreeMap::from([("add.c".to_owned(), b"int main(){}".to_vec())]);
        let s = submit_script("/jobs/u", &files, "#!/bin/bash\n./add\n");
        assert!(s.contains("mkdir -p '/jobs/u'"));
        assert!(s.contains("base64 -d > 'add.c' <<'MINIK8S_EOF'\naW50IG1haW4oKXt9\nMINIK8S_EOF"));
        assert!(s.ends_with("sbatch --parsable job.sh\n"));
        assert_eq!(parse_job_id("42\n").as_deref(), Some("42"));
        assert_eq!(parse_job_id("42;minik8s\n").as_deref(), Some("42"));
        assert_eq!(parse_job_id("sbatch: error: invalid partition\n"), None);
        assert!(valid_file_name("add.cu") && !valid_file_name("../x") && !valid_file_name("a/b"));
    }

    #[test]
    fn scontrol_records_map_to_phases() {
        let line = "JobId=7 JobName=u JobState=PENDING Reason=Resources Dependency=(null) ExitCode=0:0 SubmitTime=2026-11-24T14:54:13 StartTime=Unknown EndTime=Unknown Command=/jobs/a b/job.sh WorkDir=/jobs/a b";
        let r = parse_record(line);
        assert_eq!(r["Command"], "/jobs/a b/job.sh");
        let job = Job::from_record(&r).unwrap();
        assert_eq!(job.start, None);
        assert_eq!(phase_of(&job), ("Queued", Some("Resources".into())));
        let table = [
            ("RUNNING", "0:0", "Running", None),
            ("COMPLETING", "0:0", "Running", None),
            ("COMPLETED", "0:0", "Succeeded", None),
            ("FAILED", "3:0", "Failed", Some("Error")),
            ("CANCELLED+", "0:15", "Cancelled", Some("CANCELLED")),
            ("TIMEOUT", "0:0", "Failed", Some("TIMEOUT")),
            ("OUT_OF_MEMORY", "0:125", "Failed", Some("OUT_OF_MEMORY")),
            ("NODE_FAIL", "0:0", "Failed", Some("NODE_FAIL")),
            ("PREEMPTED", "0:0", "Failed", Some("PREEMPTED")),
        ];
        for (state, exit, phase, reason) in table {
            let r = parse_record(&format!("JobState={state} Reason=None ExitCode={exit}"));
            let job = Job::from_record(&r).unwrap();
            assert_eq!(
                phase_of(&job),
                (phase, reason.map(str::to_owned)),
                "{state}"
            );
        }
        let failed = Job::from_record(&parse_record("JobState=FAILED ExitCode=3:0")).unwrap();
        assert_eq!(failed.exit, (3, 0));
    }

    #[test]
    fn fetched_files_round_trip() {
        let script = fetch_script("/d", &[("stdout", 32768, false), ("result", 1048577, true)]);
        assert!(
            script.contains("tail -c 32768 'stdout'")
                && script.contains("head -c 1048577 'result'")
        );
        let out = "stdout 6\naGVsbG8K\nresult -\nbuild.failed 2\nMQo=\n";
        let got = parse_fetched(out);
        assert_eq!(got["stdout"], (6, b"hello\n".to_vec()));
        assert!(!got.contains_key("result"));
        assert_eq!(got["build.failed"].1, b"1\n");
        assert_eq!(tail_text("héllo".as_bytes(), 4), "llo");
    }
}
