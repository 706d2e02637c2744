//! The one place the proxy touches the kernel's tables: `iptables-restore --noflush` with our
//! own chains only, the jumps into them, and their removal.

use crate::error::{Error, Result};
use crate::model::{BASE_CHAINS, JUMPS};
use tokio::io::AsyncWriteExt;

async fn run(program: &'static str, args: &[&str], input: Option<&str>) -> Result<(bool, String)> {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| Error::Iptables {
            program,
            message: e.to_string(),
        })?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    if let Some(text) = input {
        stdin
            .write_all(text.as_bytes())
            .await
            .map_err(|e| Error::Iptables {
                program,
                message: e.to_string(),
            })?;
    }
    drop(stdin);
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| Error::Iptables {
            program,
            message: e.to_string(),
        })?;
    if out.status.success() {
        Ok((true, String::from_utf8_lossy(&out.stdout).into_owned()))
    } else {
        Ok((false, String::from_utf8_lossy(&out.stderr).into_owned()))
    }
}

/// Loads a rendered rule set in one transaction.
pub async fn restore(rules: &str) -> Result<()> {
    let (ok, err) = run("iptables-restore", &["--noflush", "-w"], Some(rules)).await?;
    if ok {
        Ok(())
    } else {
        Err(Error::Iptables {
            program: "iptables-restore",
            message: err.trim().to_owned(),
        })
    }
}

/// Makes sure the kernel chains jump into ours (the chains must exist first).
pub async fn ensure_jumps() -> Result<()> {
    for (table, hook, rule) in JUMPS {
        let args = shell_words(rule);
        let mut check = vec!["-w", "-t", table, "-C", hook];
        check.extend(args.iter().map(String::as_str));
        if !run("iptables", &check, None).await?.0 {
            let mut insert = vec!["-w", "-t", table, "-I", hook, "1"];
            insert.extend(args.iter().map(String::as_str));
            let (ok, err) = run("iptables", &insert, None).await?;
            if !ok {
                return Err(Error::Iptables {
                    program: "iptables",
                    message: err.trim().to_owned(),
                });
            }
        }
    }
    Ok(())
}

/// Splits a rule on spaces, keeping double-quoted words whole.
fn shell_words(rule: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for ch in rule.chars() {
        match ch {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// The per-service chains present in the kernel now: (table, chain).
pub async fn present_service_chains() -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for table in ["nat", "filter"] {
        let (ok, text) = run("iptables-save", &["-t", table], None).await?;
        if !ok {
            continue;
        }
        for line in text.lines() {
            if let Some(decl) = line.strip_prefix(':') {
                let name = decl.split(' ').next().unwrap_or_default();
                if ["KUBE-SVC-", "KUBE-EXT-", "KUBE-SEP-"]
                    .iter()
                    .any(|p| name.starts_with(p))
                {
                    out.push((table.to_owned(), name.to_owned()));
                }
            }
        }
    }
    Ok(out)
}

/// Removes every chain of ours and the jumps into them.
pub async fn cleanup() -> Result<()> {
    for (table, hook, rule) in JUMPS {
        let args = shell_words(rule);
        let mut delete = vec!["-w", "-t", table, "-D", hook];
        delete.extend(args.iter().map(String::as_str));
        while run("iptables", &delete, None).await?.0 {}
    }
    let mut chains: Vec<(String, String)> = present_service_chains().await?;
    chains.extend(
        BASE_CHAINS
            .iter()
            .map(|(t, c)| (t.to_string(), c.to_string())),
    );
    chains.push(("nat".into(), "KUBE-MARK-DROP".into()));
    for (table, chain) in &chains {
        run("iptables", &["-w", "-t", table, "-F", chain], None).await?;
    }
    for (table, chain) in &chains {
        run("iptables", &["-w", "-t", table, "-X", chain], None).await?;
    }
    Ok(())
}

/// Chains of ours still in the kernel (empty after [`cleanup`]).
pub async fn leftovers() -> Vec<String> {
    let mut left = Vec::new();
    for table in ["nat", "filter"] {
        if let Ok((true, text)) = run("iptables-save", &["-t", table], None).await {
            for line in text.lines() {
                if let Some(decl) = line.strip_prefix(':')
                    && decl.starts_with("KUBE-")
                {
                    left.push(format!(
                        "iptables {table} chain {}",
                        decl.split(' ').next().unwrap_or_default()
                    ));
                }
            }
        }
    }
    left
}

#[cfg(test)]
mod tests {
    #[test]
    fn rules_split_into_words_keeping_quoted_comments_whole() {
        assert_eq!(
            super::shell_words("-m comment --comment \"a b\" -j X"),
            vec!["-m", "comment", "--comment", "a b", "-j", "X"]
        );
    }
}
