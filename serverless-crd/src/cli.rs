//! `kubectl fn`: the kubectl plugin for Functions (`kubectl-fn` on the PATH). `register FILE`
//! creates or updates a Function from a Python file by server-side apply; `invoke NAME [JSON|-]`
//! prints the function's JSON answer (non-zero exit and the error on failure; `NAME@TAG` calls
//! the revision a tag names); `list`, `logs NAME`, `delete NAME`; `revisions NAME`, `traffic
//! NAME --to REV=PERCENT,… [--tag REV=TAG,…]` (a rollback is a traffic change); `wf start NAME [--input JSON] [--wait]`, `wf runs NAME`, `wf describe
//! RUN` for Workflows. `-n/--namespace` as kubectl, else the kubeconfig's namespace.

use crate::types::Function;
use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

/// The plugin's arguments.
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-fn",
    about = "Register, invoke and manage minik8s Functions"
)]
pub struct Args {
    /// The namespace (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Creates or updates a Function from a Python file (server-side apply).
    Register {
        /// The Python module.
        file: PathBuf,
        /// The Function's name (default: the file's name without `.py`).
        #[arg(long)]
        name: Option<String>,
        /// `module.function` to call (default `main.handler`; the file is stored as the module).
        #[arg(long, default_value = "main.handler")]
        handler: String,
        /// Pods kept when idle.
        #[arg(long)]
        min: Option<i32>,
        /// Most pods.
        #[arg(long)]
        max: Option<i32>,
        /// Requests one pod serves at once.
        #[arg(long)]
        target_concurrency: Option<i32>,
        /// Seconds without requests before scaling to zero.
        #[arg(long)]
        scale_to_zero_after: Option<i32>,
        /// Longest time one invocation may take.
        #[arg(long)]
        timeout: Option<i64>,
        /// `pod` (pods of its own) or `module` (loaded into the warm function bases).
        #[arg(long, value_parser = ["pod", "module"])]
        placement: Option<String>,
    },
    /// Invokes a function with a JSON event (an argument, `-` for standard input, or `{}`).
    Invoke {
        /// The Function, or `NAME@TAG` for the revision its traffic tags so.
        name: String,
        /// The event.
        data: Option<String>,
    },
    /// Lists Functions.
    List,
    /// Lists a function's revisions, newest first, with their share of its traffic.
    Revisions {
        /// The Function.
        name: String,
    },
    /// Sets how a function's calls are split between its revisions (`spec.traffic`):
    /// `--to add-00001=90,add-00002=10` (`@latest` is the latest ready revision), and
    /// `--tag add-00002=canary` to reach a revision at `…/add@canary` whatever its share.
    Traffic {
        /// The Function.
        name: String,
        /// `REVISION=PERCENT,…` summing to 100.
        #[arg(long, value_delimiter = ',', required = true)]
        to: Vec<String>,
        /// `REVISION=TAG,…`.
        #[arg(long, value_delimiter = ',')]
        tag: Vec<String>,
    },
    /// Prints the logs of a function's pods.
    Logs {
        /// The Function.
        name: String,
    },
    /// Deletes a Function (and with it its pods, Deployment, Service and code).
    Delete {
        /// The Function.
        name: String,
    },
    /// Workflows: start runs, list them, show one step by step.
    #[command(subcommand)]
    Wf(Wf),
}

#[derive(Subcommand, Debug)]
enum Wf {
    /// Starts a run of a Workflow (a WorkflowRun named `<workflow>-<random>`).
    Start {
        /// The Workflow.
        name: String,
        /// The first step's input (JSON).
        #[arg(long)]
        input: Option<String>,
        /// Waits for the run to end and prints its output (or its error, exiting non-zero).
        #[arg(long)]
        wait: bool,
    },
    /// Lists a Workflow's runs.
    Runs {
        /// The Workflow.
        name: String,
    },
    /// Shows a run's steps as a timeline with durations.
    Describe {
        /// The WorkflowRun.
        run: String,
    },
}

/// Why the plugin failed (printed, with a non-zero exit).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reaching the cluster.
    #[error("{}", describe(.0))]
    Kube(#[from] kube::Error),
    /// The kubeconfig.
    #[error("{0}")]
    Config(String),
    /// A local file.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The invocation failed.
    #[error("{0}")]
    Invoke(String),
}

/// An API error as kubectl prints it (`Error from server (NotFound): …`).
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("Error from server ({}): {}", s.reason, s.message),
        other => other.to_string(),
    }
}

/// Runs the plugin.
pub async fn run(args: Args) -> Result<(), Error> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Config(e.to_string()))?;
    let ns = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config)?;
    let functions: Api<Function> = Api::namespaced(client.clone(), &ns);
    match args.command {
        Command::Register {
            file,
            name,
            handler,
            min,
            max,
            target_concurrency,
            scale_to_zero_after,
            timeout,
            placement,
        } => {
            let code = std::fs::read_to_string(&file).map_err(|source| Error::Read {
                path: file.clone(),
                source,
            })?;
            let name = name.unwrap_or_else(|| {
                file.file_stem()
                    .map(|s| s.to_string_lossy().replace('_', "-").to_lowercase())
                    .unwrap_or_default()
            });
            let mut scale = serde_json::Map::new();
            for (k, v) in [
                ("minScale", min),
                ("maxScale", max),
                ("targetConcurrency", target_concurrency),
                ("scaleToZeroAfterSeconds", scale_to_zero_after),
            ] {
                if let Some(v) = v {
                    scale.insert(k.into(), v.into());
                }
            }
            let mut spec = serde_json::json!({"runtime": "python3", "handler": handler,
                "source": {"inline": code}});
            if !scale.is_empty() {
                spec["scale"] = scale.into();
            }
            if let Some(t) = timeout {
                spec["timeoutSeconds"] = t.into();
            }
            if let Some(p) = placement {
                spec["placement"] = p.into();
            }
            let f = serde_json::json!({
                "apiVersion": "serverless.minik8s.io/v1alpha1", "kind": "Function",
                "metadata": {"name": name}, "spec": spec,
            });
            functions
                .patch(
                    &name,
                    &PatchParams::apply("kubectl-fn").force(),
                    &Patch::Apply(&f),
                )
                .await?;
            println!("function.serverless.minik8s.io/{name} registered");
        }
        Command::Invoke { name, data } => {
            let body = match data.as_deref() {
                Some("-") => {
                    let mut s = String::new();
                    std::io::stdin()
                        .read_to_string(&mut s)
                        .map_err(|source| Error::Read {
                            path: "-".into(),
                            source,
                        })?;
                    s
                }
                Some(d) => d.to_owned(),
                None => "{}".to_owned(),
            };
            let (name, tag) = match name.split_once('@') {
                Some((n, t)) => (n.to_owned(), Some(t.to_owned())),
                None => (name, None),
            };
            // A function registered a moment ago gets its URL from the controller shortly.
            let mut url = None;
            for _ in 0..50 {
                let f = functions.get(&name).await?;
                url = f.status.and_then(|s| s.url);
                if url.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let url =
                url.ok_or_else(|| Error::Invoke(format!("function {name} has no URL yet")))?;
            let url = match tag {
                Some(t) => format!("{url}@{t}"),
                None => url,
            };
            let (code, answer) = crate::gateway::post(&url, body.into_bytes().into())
                .await
                .map_err(Error::Invoke)?;
            let text = String::from_utf8_lossy(&answer).into_owned();
            if !code.is_success() {
                return Err(Error::Invoke(format!("{}: {text}", code.as_u16())));
            }
            println!("{text}");
        }
        Command::List => {
            println!("{:<24} {:<6} {:<9} URL", "NAME", "READY", "REPLICAS");
            for f in functions.list(&ListParams::default()).await? {
                let status = f.status.clone().unwrap_or_default();
                let ready = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "Ready")
                    .map_or("Unknown", |c| c.status.as_str())
                    .to_owned();
                println!(
                    "{:<24} {:<6} {:<9} {}",
                    f.name_any(),
                    ready,
                    status.replicas,
                    status.url.unwrap_or_default()
                );
            }
        }
        Command::Revisions { name } => {
            let revisions: Api<crate::types::FunctionRevision> = Api::namespaced(client, &ns);
            let lp =
                ListParams::default().labels(&format!("{}={name}", crate::runtime::FUNCTION_LABEL));
            let mut list = revisions.list(&lp).await?.items;
            list.sort_by_key(|r| std::cmp::Reverse(crate::revision::order(&name, r)));
            println!(
                "{:<28} {:<10} {:<7} {:<9} {:<16} REASON",
                "NAME", "GENERATION", "READY", "REPLICAS", "TRAFFIC"
            );
            for r in list {
                let status = r.status.clone().unwrap_or_default();
                let ready = crate::revision::find(&status.conditions, "Ready");
                println!(
                    "{:<28} {:<10} {:<7} {:<9} {:<16} {}",
                    r.name_any(),
                    r.spec.generation,
                    ready.map_or("Unknown", |c| c.status.as_str()),
                    status.replicas,
                    status.traffic.unwrap_or_default(),
                    ready.map_or("", |c| c.reason.as_str()),
                );
            }
        }
        Command::Traffic { name, to, tag } => {
            let traffic = traffic_spec(&to, &tag).map_err(Error::Invoke)?;
            let patch = serde_json::json!({"spec": {"traffic": traffic}});
            functions
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            println!(
                "function.serverless.minik8s.io/{name} traffic: {}",
                to.join(",")
            );
        }
        Command::Logs { name } => {
            let pods: Api<Pod> = Api::namespaced(client, &ns);
            let lp =
                ListParams::default().labels(&format!("{}={name}", crate::runtime::FUNCTION_LABEL));
            for p in pods.list(&lp).await? {
                let logs = pods.logs(&p.name_any(), &LogParams::default()).await?;
                for line in logs.lines() {
                    println!("[{}] {line}", p.name_any());
                }
            }
        }
        Command::Delete { name } => {
            functions.delete(&name, &DeleteParams::default()).await?;
            println!("function.serverless.minik8s.io \"{name}\" deleted");
        }
        Command::Wf(wf) => workflows(client, &ns, wf).await?,
    }
    Ok(())
}

/// `spec.traffic` from `REVISION=PERCENT` and `REVISION=TAG` pairs (`@latest`: the latest
/// ready revision). A tag of a revision with no share is a target of 0 %.
fn traffic_spec(to: &[String], tags: &[String]) -> Result<Vec<serde_json::Value>, String> {
    use serde_json::json;
    let target = |rev: &str| {
        if rev == "@latest" {
            json!({"latestRevision": true})
        } else {
            json!({"revisionName": rev})
        }
    };
    let mut out: Vec<(String, serde_json::Value)> = Vec::new();
    for pair in to.iter().filter(|p| !p.is_empty()) {
        let (rev, percent) = pair
            .split_once('=')
            .ok_or_else(|| format!("--to {pair}: expected REVISION=PERCENT"))?;
        let percent: i64 = percent
            .parse()
            .map_err(|_| format!("--to {pair}: {percent} is not a whole percentage"))?;
        let mut t = target(rev);
        t["percent"] = percent.into();
        out.push((rev.to_owned(), t));
    }
    for pair in tags.iter().filter(|p| !p.is_empty()) {
        let (rev, tag) = pair
            .split_once('=')
            .ok_or_else(|| format!("--tag {pair}: expected REVISION=TAG"))?;
        match out
            .iter_mut()
            .find(|(r, t)| r == rev && t.get("tag").is_none())
        {
            Some((_, t)) => t["tag"] = tag.into(),
            None => {
                let mut t = target(rev);
                t["percent"] = 0.into();
                t["tag"] = tag.into();
                out.push((rev.to_owned(), t));
            }
        }
    }
    Ok(out.into_iter().map(|(_, t)| t).collect())
}

/// A duration as people read it (`4.2ms`, `1.305s`).
fn human(seconds: f64) -> String {
    if seconds < 1.0 {
        format!("{:.1}ms", seconds * 1000.0)
    } else {
        format!("{seconds:.3}s")
    }
}

async fn workflows(client: Client, ns: &str, wf: Wf) -> Result<(), Error> {
    use crate::workflow::controller::WORKFLOW_LABEL;
    use crate::workflow::engine::seconds_between;
    use crate::workflow::types::{Phase, Workflow, WorkflowRun};
    use kube::api::PostParams;
    let runs: Api<WorkflowRun> = Api::namespaced(client.clone(), ns);
    match wf {
        Wf::Start { name, input, wait } => {
            let workflow = Api::<Workflow>::namespaced(client, ns).get(&name).await?;
            let input: serde_json::Value = match input {
                Some(text) => serde_json::from_str(&text)
                    .map_err(|e| Error::Invoke(format!("--input is not JSON: {e}")))?,
                None => serde_json::json!({}),
            };
            let owner = workflow
                .controller_owner_ref(&())
                .expect("a stored Workflow");
            let run: WorkflowRun = serde_json::from_value(serde_json::json!({
                "apiVersion": "serverless.minik8s.io/v1alpha1", "kind": "WorkflowRun",
                "metadata": {"generateName": format!("{name}-"), "labels": {WORKFLOW_LABEL: name},
                    "ownerReferences": [owner]},
                "spec": {"workflowRef": {"name": name}, "input": input},
            }))
            .expect("a WorkflowRun");
            let made = runs.create(&PostParams::default(), &run).await?;
            let run_name = made.name_any();
            if !wait {
                println!("workflowrun.serverless.minik8s.io/{run_name} started");
                return Ok(());
            }
            loop {
                let r = runs.get(&run_name).await?;
                let status = r.status.unwrap_or_default();
                match status.phase {
                    Phase::Succeeded => {
                        let output = match (status.output, status.output_ref) {
                            (Some(o), _) => o.to_string(),
                            (None, Some(cm)) => format!("(in ConfigMap {cm}, key value)"),
                            (None, None) => "null".into(),
                        };
                        println!("{output}");
                        return Ok(());
                    }
                    Phase::Failed => {
                        return Err(Error::Invoke(format!(
                            "run {run_name} failed: {}: {}",
                            status.error.unwrap_or_default(),
                            status.cause.unwrap_or_default()
                        )));
                    }
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
        Wf::Runs { name } => {
            let lp = ListParams::default().labels(&format!("{WORKFLOW_LABEL}={name}"));
            println!("{:<32} {:<10} {:<16} DURATION", "NAME", "PHASE", "STEP");
            for r in runs.list(&lp).await? {
                let status = r.status.clone().unwrap_or_default();
                println!(
                    "{:<32} {:<10} {:<16} {}",
                    r.name_any(),
                    format!("{:?}", status.phase),
                    status.step.unwrap_or_default(),
                    status.duration.unwrap_or_default()
                );
            }
        }
        Wf::Describe { run } => {
            let r = runs.get(&run).await?;
            let status = r.status.clone().unwrap_or_default();
            println!("Run:       {run}");
            if let Some(w) = r.spec.workflow_ref.as_ref() {
                println!("Workflow:  {}", w.name);
            }
            println!("Phase:     {:?}", status.phase);
            if let Some(d) = &status.duration {
                println!("Duration:  {d}");
            }
            if let Some(e) = &status.error {
                println!(
                    "Error:     {e}: {}",
                    status.cause.clone().unwrap_or_default()
                );
            }
            if let Some(o) = &status.output {
                println!("Output:    {o}");
            }
            println!("Steps:");
            println!(
                "  {:>9}  {:<28} {:<8} {:>9}  {:<8} NEXT",
                "AT", "STEP", "TYPE", "TOOK", "ATTEMPTS"
            );
            let start = status.start_time.clone().unwrap_or_default();
            for s in &status.steps {
                let at = seconds_between(&start, &s.start_time)
                    .map(human)
                    .unwrap_or_default();
                let took = seconds_between(&s.start_time, &s.end_time)
                    .map(human)
                    .unwrap_or_default();
                let next = match (&s.next, &s.error) {
                    (Some(n), Some(e)) => format!("{n} (caught {e})"),
                    (Some(n), None) => n.clone(),
                    (None, Some(e)) => format!("(failed: {e})"),
                    (None, None) => "(end)".into(),
                };
                println!(
                    "  {:>9}  {:<28} {:<8} {:>9}  {:<8} {next}",
                    format!("+{at}"),
                    format!("{}{}", s.path, s.name),
                    format!("{:?}", s.type_),
                    took,
                    if s.attempts > 0 {
                        s.attempts.to_string()
                    } else {
                        "-".into()
                    },
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn traffic_flags_become_spec_traffic() {
        let to = ["add-00001=90".to_owned(), "@latest=10".to_owned()];
        let tags = ["add-00001=stable".to_owned(), "add-00003=next".to_owned()];
        assert_eq!(
            traffic_spec(&to, &tags).unwrap(),
            vec![
                json!({"revisionName": "add-00001", "percent": 90, "tag": "stable"}),
                json!({"latestRevision": true, "percent": 10}),
                json!({"revisionName": "add-00003", "percent": 0, "tag": "next"}),
            ]
        );
        assert!(traffic_spec(&["add-00001".to_owned()], &[]).is_err());
        assert!(traffic_spec(&["add-00001=ten".to_owned()], &[]).is_err());
    }
}
