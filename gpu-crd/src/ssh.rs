//! The login node, reached with the system's OpenSSH client as a process. Why not an SSH
//! library: OpenSSH is what the seed used and what operators debug with; it verifies the host
//! key against the one registered with the cluster (`StrictHostKeyChecking=yes`), and its
//! connection sharing (`ControlMaster`) makes each command after the first a new channel on
//! one connection, which is what many jobs polled at once need. The key and the known host
//! are written to a private folder (mode 0700) from the cluster's Secret.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Why talking to the login node failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cluster's Secret lacks something.
    #[error("cluster secret: {0}")]
    Secret(String),
    /// SSH could not reach or log in to the login node.
    #[error("login node {target} unreachable: {message}")]
    Unreachable {
        /// `user@host:port`.
        target: String,
        /// What ssh said.
        message: String,
    },
    /// Running ssh, or writing its files, failed.
    #[error("ssh: {0}")]
    Io(#[from] std::io::Error),
}

/// How to reach a cluster's login node (from its Secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Host name or address.
    pub host: String,
    /// SSH port.
    pub port: u16,
    /// Login user.
    pub user: String,
    /// The private key (OpenSSH format).
    pub private_key: String,
    /// The host's public key (`ssh-ed25519 AAAA…`).
    pub host_key: String,
    /// The folder job folders go under.
    pub work_dir: String,
}

impl Target {
    /// Reads a Secret's data (keys `host`, `port`, `user`, `privateKey`, `hostKey`, `workDir`).
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Result<Target, Error> {
        let get = |k: &str| -> Result<String, Error> {
            data.get(k)
                .map(|v| String::from_utf8_lossy(v).trim().to_owned())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| Error::Secret(format!("missing {k:?}")))
        };
        let port = match data.get("port") {
            Some(p) => String::from_utf8_lossy(p)
                .trim()
                .parse()
                .map_err(|_| Error::Secret("port is not a number".into()))?,
            None => 22,
        };
        Ok(Target {
            host: get("host")?,
            port,
            user: get("user")?,
            private_key: get("privateKey")? + "\n",
            host_key: get("hostKey")?,
            work_dir: get("workDir").unwrap_or_else(|_| "minik8s-gpujobs".into()),
        })
    }

    fn name(&self) -> String {
        format!("{}@{}:{}", self.user, self.host, self.port)
    }
}

/// A command's outcome on the login node.
#[derive(Clone, Debug)]
pub struct Output {
    /// Its exit code.
    pub code: i32,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

/// A login node with its key files written.
pub struct Login {
    target: Target,
    dir: PathBuf,
}

impl Login {
    /// Writes the key and known host for `target` under `dir` (created mode 0700).
    pub fn new(target: Target, dir: PathBuf) -> Result<Login, Error> {
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let key = dir.join("key");
        std::fs::write(&key, &target.private_key)?;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        let host = if target.port == 22 {
            target.host.clone()
        } else {
            format!("[{}]:{}", target.host, target.port)
        };
        std::fs::write(
            dir.join("known_hosts"),
            format!("{host} {}\n", target.host_key),
        )?;
        Ok(Login { target, dir })
    }

    /// The cluster this login reaches.
    pub fn target(&self) -> &Target {
        &self.target
    }

    fn command(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("ssh");
        c.arg("-i")
            .arg(self.dir.join("key"))
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                self.dir.join("known_hosts").display()
            ))
            .args([
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=5",
                "-o",
                "ServerAliveInterval=5",
                "-o",
                "ControlMaster=auto",
                "-o",
                "ControlPersist=30",
            ])
            .arg("-o")
            .arg(format!("ControlPath={}", self.dir.join("cm").display()))
            .arg("-p")
            .arg(self.target.port.to_string())
            .arg(format!("{}@{}", self.target.user, self.target.host))
            .kill_on_drop(true);
        c
    }

    /// Runs `command` on the login node with `stdin`, within `timeout`. An unreachable node
    /// (ssh's exit code 255, or no answer in time) is [`Error::Unreachable`].
    pub async fn run(
        &self,
        command: &str,
        stdin: Option<&str>,
        timeout: Duration,
    ) -> Result<Output, Error> {
        let mut c = self.command();
        c.arg(command)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn()?;
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().expect("piped stdin");
            let input = input.as_bytes().to_vec();
            minik8s_task::spawn("ssh-stdin", async move {
                let _ = pipe.write_all(&input).await;
            });
        }
        let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(out) => out?,
            Err(_) => {
                return Err(Error::Unreachable {
                    target: self.target.name(),
                    message: format!("no answer within {timeout:?}"),
                });
            }
        };
        let code = out.status.code().unwrap_or(-1);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if code == 255 {
            return Err(Error::Unreachable {
                target: self.target.name(),
                message: stderr.trim().to_owned(),
            });
        }
        Ok(Output {
            code,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr,
        })
    }

    /// Closes the shared connection, if one is open.
    pub async fn close(&self) {
        let mut c = self.command();
        c.args(["-O", "exit"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = c.status().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_names_the_login_node() {
        let data: BTreeMap<String, Vec<u8>> = [
            ("host", "127.0.0.1"),
            ("port", "2222"),
            ("user", "root"),
            ("privateKey", "KEY"),
            ("hostKey", "ssh-ed25519 AAAA"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.as_bytes().to_vec()))
        .collect();
        let t = Target::from_data(&data).unwrap();
        assert_eq!((t.port, t.work_dir.as_str()), (2222, "minik8s-gpujobs"));
        let mut missing = data.clone();
        missing.remove("hostKey");
        assert!(
            Target::from_data(&missing)
                .unwrap_err()
                .to_string()
                .contains("hostKey")
        );
    }
}
