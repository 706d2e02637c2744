//! Pod volumes on the node: emptyDir (on disk or tmpfs), hostPath, configMap, secret,
//! downwardAPI and projected (with bound service-account tokens), written under the pod's
//! folder, and persistentVolumeClaim (the bound volume's folder on this node, `local` or
//! `hostPath`), all mounted into containers through the CRI.

use super::env::{self, config_map_entries, secret_entries};
use super::spec::Layout;
use crate::cri;
use crate::error::{Error, Result, io};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    Container, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount, Volume,
};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Each volume's folder (or file) on the node, by volume name.
pub type Prepared = HashMap<String, PathBuf>;

fn mounted(path: &Path) -> bool {
    let p = path.display().to_string();
    std::fs::read_to_string("/proc/self/mounts")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(p.as_str())))
}

async fn run(cmd: &str, args: &[&str]) -> Result<()> {
    let out = tokio::process::Command::new(cmd)
        .args(args)
        .output()
        .await
        .map_err(io(cmd))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Pod(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Writes `files` (relative path → bytes, mode) into `dir` as upstream's atomic writer does,
/// so that a running container sees an update at once and never half of one: the files go
/// into a new `..<version>` folder, the `..data` link is swapped to it in one rename, and
/// each top-level name is a link through `..data`. The mounted folder itself stays, so an
/// update reaches containers that have it mounted. Unchanged content writes nothing.
fn write_files(dir: &Path, files: &BTreeMap<String, (Vec<u8>, u32)>) -> Result<()> {
    use std::hash::{Hash, Hasher};
    for rel in files.keys() {
        if rel.split('/').any(|p| p == ".." || p.is_empty()) || rel.starts_with("..") {
            return Err(Error::Pod(format!("invalid volume path {rel:?}")));
        }
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    files.hash(&mut h);
    let version = format!("..{:016x}", h.finish());
    let data = dir.join("..data");
    if std::fs::read_link(&data).is_ok_and(|t| t == Path::new(&version)) {
        return Ok(());
    }
    let fresh = dir.join(&version);
    if fresh.exists() {
        std::fs::remove_dir_all(&fresh).map_err(io(&fresh))?;
    }
    for (rel, (bytes, mode)) in files {
        let path = fresh.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, bytes).map_err(io(&path))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))
            .map_err(io(&path))?;
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&version, &tmp).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &data).map_err(io(&data))?;
    let tops: std::collections::BTreeSet<&str> =
        files.keys().filter_map(|k| k.split('/').next()).collect();
    for top in &tops {
        let link = dir.join(top);
        let is_link = std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            // A file or folder of the old layout (a kubelet before the atomic writer).
            let _ = std::fs::remove_dir_all(&link);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(format!("..data/{top}"), &link).map_err(io(&link))?;
        }
    }
    // What no longer belongs: names gone from the volume, and older versions.
    for entry in std::fs::read_dir(dir).map_err(io(dir))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "..data" || name == version || tops.contains(name.as_str()) {
            continue;
        }
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path).map_err(io(&path))?,
            _ => std::fs::remove_file(&path).map_err(io(&path))?,
        }
    }
    Ok(())
}

/// The kinds of volume whose content comes from the API and follows its changes.
fn follows_api(v: &Volume) -> bool {
    v.config_map.is_some()
        || v.secret.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some()
}

/// Rewrites the pod's configMap, secret, downwardAPI and projected volumes from the API's
/// current objects (upstream's kubelet does so on its periodic sync): containers see
/// updates, and an optional source that appears later.
pub async fn refresh(
    client: &Client,
    layout: &Layout,
    pod: &Pod,
    pod_ip: Option<&str>,
) -> Result<()> {
    let dir = layout
        .pod_dir(&pod.uid().unwrap_or_default())
        .join("volumes");
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        // Bound tokens are not re-requested on every sync (they live an hour).
        let token = v
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
            .any(|s| s.service_account_token.is_some());
        if follows_api(v) && !token {
            prepare_one(client, pod, v, &dir, pod_ip).await?;
        }
    }
    Ok(())
}

/// Whether the pod has volumes that follow the API.
pub fn has_followed(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(follows_api)
}

/// Selects `items` (or every key) of `data` as files.
fn pick(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    mode: u32,
    what: &str,
) -> Result<BTreeMap<String, (Vec<u8>, u32)>> {
    match items {
        None => Ok(data.into_iter().map(|(k, v)| (k, (v, mode))).collect()),
        Some(items) => items
            .iter()
            .map(|i| {
                let v = data
                    .get(&i.key)
                    .cloned()
                    .ok_or_else(|| Error::Pod(format!("couldn't find key {} in {what}", i.key)))?;
                Ok((i.path.clone(), (v, i.mode.map_or(mode, |m| m as u32))))
            })
            .collect(),
    }
}

async fn token(
    client: &Client,
    pod: &Pod,
    audience: Option<String>,
    seconds: Option<i64>,
) -> Result<String> {
    let ns = pod.namespace().unwrap_or_default();
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audience.into_iter().collect(),
            expiration_seconds: Some(seconds.unwrap_or(3600)),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name_any()),
                uid: pod.uid(),
            }),
        },
        ..Default::default()
    };
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let out: TokenRequest = api
        .create_subresource("token", &sa, &PostParams::default(), &req)
        .await?;
    Ok(out.status.map(|s| s.token).unwrap_or_default())
}

/// Files of a downward API volume or projection.
fn downward(
    pod: &Pod,
    items: &[k8s_openapi::api::core::v1::DownwardAPIVolumeFile],
    mode: u32,
    pod_ip: Option<&str>,
) -> Result<BTreeMap<String, (Vec<u8>, u32)>> {
    let spec = pod.spec.clone().unwrap_or_default();
    items
        .iter()
        .map(|i| {
            let value = if let Some(f) = &i.field_ref {
                env::field(pod, &f.field_path, pod_ip, None)?
            } else if let Some(r) = &i.resource_field_ref {
                let c = spec
                    .containers
                    .iter()
                    .find(|c| Some(&c.name) == r.container_name.as_ref())
                    .cloned()
                    .unwrap_or_default();
                env::resource_field(&c, &r.resource, r.divisor.as_ref().map(|d| d.0.as_str()))?
            } else {
                String::new()
            };
            Ok((
                i.path.clone(),
                (value.into_bytes(), i.mode.map_or(mode, |m| m as u32)),
            ))
        })
        .collect()
}

/// The folder of the volume bound to claim `ns/name`.
async fn claim_path(client: &Client, ns: &str, name: &str) -> Result<PathBuf> {
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?
        .ok_or_else(|| Error::Pod(format!("persistentvolumeclaim \"{name}\" not found")))?;
    let volume = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            Error::Pod(format!(
                "persistentvolumeclaim \"{name}\" is not bound to a volume yet"
            ))
        })?;
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get_opt(&volume)
        .await?
        .ok_or_else(|| Error::Pod(format!("persistentvolume \"{volume}\" not found")))?;
    let spec = pv.spec.unwrap_or_default();
    let path = match (&spec.local, &spec.host_path) {
        (Some(l), _) => PathBuf::from(&l.path),
        (None, Some(h)) => {
            let p = PathBuf::from(&h.path);
            if h.type_.as_deref() == Some("DirectoryOrCreate") {
                std::fs::create_dir_all(&p).map_err(io(&p))?;
            }
            p
        }
        _ => {
            return Err(Error::Pod(format!(
                "persistentvolume \"{volume}\": unsupported volume type"
            )));
        }
    };
    if !path.exists() {
        return Err(Error::Pod(format!(
            "persistentvolume \"{volume}\": {} does not exist on this node",
            path.display()
        )));
    }
    Ok(path)
}

async fn prepare_one(
    client: &Client,
    pod: &Pod,
    v: &Volume,
    dir: &Path,
    pod_ip: Option<&str>,
) -> Result<PathBuf> {
    let ns = pod.namespace().unwrap_or_default();
    if let Some(h) = &v.host_path {
        let path = PathBuf::from(&h.path);
        match h.type_.as_deref() {
            Some("DirectoryOrCreate") => std::fs::create_dir_all(&path).map_err(io(&path))?,
            Some("FileOrCreate") if !path.exists() => {
                std::fs::write(&path, b"").map_err(io(&path))?
            }
            Some("Directory") if !path.is_dir() => {
                return Err(Error::Pod(format!(
                    "hostPath type check failed: {} is not a directory",
                    h.path
                )));
            }
            Some("File") if !path.is_file() => {
                return Err(Error::Pod(format!(
                    "hostPath type check failed: {} is not a file",
                    h.path
                )));
            }
            _ => {}
        }
        return Ok(path);
    }
    if let Some(c) = &v.persistent_volume_claim {
        return claim_path(client, &ns, &c.claim_name).await;
    }
    let path = dir.join(&v.name);
    if let Some(e) = &v.empty_dir {
        std::fs::create_dir_all(&path).map_err(io(&path))?;
        if e.medium.as_deref() == Some("Memory") && !mounted(&path) {
            let size = e
                .size_limit
                .as_ref()
                .map(|q| {
                    format!(
                        "size={}",
                        minik8s_types::Quantity::parse(&q.0).map_or(0, |q| q.units())
                    )
                })
                .filter(|s| s != "size=0");
            let mut args = vec!["-t", "tmpfs"];
            if let Some(s) = &size {
                args.extend(["-o", s.as_str()]);
            }
            let p = path.display().to_string();
            args.extend(["tmpfs", p.as_str()]);
            run("mount", &args).await?;
        }
        // Anyone may write an emptyDir, as upstream makes it (0777): a non-root container too.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
            .map_err(io(&path))?;
        return Ok(path);
    }
    let files = if let Some(c) = &v.config_map {
        let mode = c.default_mode.unwrap_or(0o644) as u32;
        match config_map_entries(client, &ns, &c.name).await? {
            Some(data) => pick(
                data,
                c.items.as_ref(),
                mode,
                &format!("ConfigMap {ns}/{}", c.name),
            )?,
            None if c.optional == Some(true) => BTreeMap::new(),
            None => return Err(Error::Pod(format!("configmap \"{}\" not found", c.name))),
        }
    } else if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let mode = s.default_mode.unwrap_or(0o644) as u32;
        match secret_entries(client, &ns, &name).await? {
            Some(data) => pick(data, s.items.as_ref(), mode, &format!("Secret {ns}/{name}"))?,
            None if s.optional == Some(true) => BTreeMap::new(),
            None => return Err(Error::Pod(format!("secret \"{name}\" not found"))),
        }
    } else if let Some(d) = &v.downward_api {
        let mode = d.default_mode.unwrap_or(0o644) as u32;
        downward(pod, d.items.as_deref().unwrap_or_default(), mode, pod_ip)?
    } else if let Some(p) = &v.projected {
        let mode = p.default_mode.unwrap_or(0o644) as u32;
        let mut files = BTreeMap::new();
        for s in p.sources.iter().flatten() {
            if let Some(c) = &s.config_map {
                match config_map_entries(client, &ns, &c.name).await? {
                    Some(data) => files.extend(pick(
                        data,
                        c.items.as_ref(),
                        mode,
                        &format!("ConfigMap {ns}/{}", c.name),
                    )?),
                    None if c.optional == Some(true) => {}
                    None => return Err(Error::Pod(format!("configmap \"{}\" not found", c.name))),
                }
            }
            if let Some(c) = &s.secret {
                match secret_entries(client, &ns, &c.name).await? {
                    Some(data) => files.extend(pick(
                        data,
                        c.items.as_ref(),
                        mode,
                        &format!("Secret {ns}/{}", c.name),
                    )?),
                    None if c.optional == Some(true) => {}
                    None => return Err(Error::Pod(format!("secret \"{}\" not found", c.name))),
                }
            }
            if let Some(d) = &s.downward_api {
                files.extend(downward(
                    pod,
                    d.items.as_deref().unwrap_or_default(),
                    mode,
                    pod_ip,
                )?);
            }
            if let Some(t) = &s.service_account_token {
                let jwt = token(client, pod, t.audience.clone(), t.expiration_seconds).await?;
                files.insert(t.path.clone(), (jwt.into_bytes(), mode));
            }
        }
        files
    } else {
        return Err(Error::Pod(format!(
            "volume {:?}: unsupported volume type",
            v.name
        )));
    };
    write_files(&path, &files)?;
    Ok(path)
}

/// Writes or creates every volume of the pod under its folder.
pub async fn prepare(
    client: &Client,
    layout: &Layout,
    pod: &Pod,
    pod_ip: Option<&str>,
) -> Result<Prepared> {
    let dir = layout
        .pod_dir(&pod.uid().unwrap_or_default())
        .join("volumes");
    let mut out = Prepared::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        out.insert(
            v.name.clone(),
            prepare_one(client, pod, v, &dir, pod_ip).await?,
        );
    }
    Ok(out)
}

/// A mount's sub-path: `subPath`, or `subPathExpr` expanded from the container's environment
/// (every variable it names must be set and non-empty), as upstream's `makeMounts`: never
/// absolute, never with a `..` step.
fn sub_path(
    m: &k8s_openapi::api::core::v1::VolumeMount,
    envs: &[cri::KeyValue],
) -> Result<Option<String>> {
    let sub = match m.sub_path_expr.as_deref().filter(|s| !s.is_empty()) {
        Some(expr) => {
            let vars: std::collections::BTreeMap<String, String> = envs
                .iter()
                .filter(|kv| !kv.value.is_empty())
                .map(|kv| (kv.key.clone(), kv.value.clone()))
                .collect();
            let mut missing: Vec<String> = Vec::new();
            let mut rest = expr;
            while let Some(i) = rest.find("$(") {
                let after = &rest[i + 2..];
                let Some(end) = after.find(')') else { break };
                let name = &after[..end];
                if !vars.contains_key(name) && !missing.iter().any(|n| n == name) {
                    missing.push(name.to_owned());
                }
                rest = &after[end + 1..];
            }
            if !missing.is_empty() {
                missing.sort();
                return Err(Error::Pod(format!(
                    "missing value for {}",
                    missing.join(", ")
                )));
            }
            Some(super::env::expand(expr, &vars))
        }
        None => m.sub_path.clone().filter(|s| !s.is_empty()),
    };
    let Some(sub) = sub else { return Ok(None) };
    if sub.starts_with('/') {
        return Err(Error::Pod(format!(
            "error SubPath `{sub}` must not be an absolute path"
        )));
    }
    if sub.split('/').any(|p| p == "..") {
        return Err(Error::Pod(format!(
            "unable to provision SubPath `{sub}`: must not contain '..'"
        )));
    }
    Ok(Some(sub))
}

/// The container's mounts from its volumeMounts (sub-paths expanded from `envs`).
pub fn mounts(
    c: &Container,
    prepared: &Prepared,
    envs: &[cri::KeyValue],
) -> Result<Vec<cri::Mount>> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            let base = prepared
                .get(&m.name)
                .ok_or_else(|| Error::Pod(format!("volume {:?} not found", m.name)))?;
            let host = match sub_path(m, envs)? {
                Some(sub) => {
                    let p = base.join(sub);
                    if !p.exists() {
                        std::fs::create_dir_all(&p).map_err(io(&p))?;
                    }
                    p
                }
                None => base.clone(),
            };
            Ok(cri::Mount {
                container_path: m.mount_path.clone(),
                host_path: host.display().to_string(),
                readonly: m.read_only.unwrap_or(false),
                ..Default::default()
            })
        })
        .collect()
}

/// Removes the pod's folder, unmounting its tmpfs volumes first.
pub async fn remove(layout: &Layout, uid: &str) -> Result<()> {
    let dir = layout.pod_dir(uid);
    let prefix = dir.display().to_string();
    let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(1).map(str::to_owned))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    for m in mounts {
        run("umount", &[&m]).await?;
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::VolumeMount;

    fn mount(sub: Option<&str>, expr: Option<&str>) -> VolumeMount {
        VolumeMount {
            name: "v".into(),
            mount_path: "/m".into(),
            sub_path: sub.map(str::to_owned),
            sub_path_expr: expr.map(str::to_owned),
            ..Default::default()
        }
    }

    fn env(k: &str, v: &str) -> cri::KeyValue {
        cri::KeyValue {
            key: k.into(),
            value: v.into(),
        }
    }

    #[test]
    fn volumes_are_written_atomically_through_a_data_link() {
        let dir = std::env::temp_dir().join(format!("mk8s-atomic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let files = |pairs: &[(&str, &str)]| -> BTreeMap<String, (Vec<u8>, u32)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), (v.as_bytes().to_vec(), 0o644)))
                .collect()
        };
        write_files(&dir, &files(&[("a", "1"), ("sub/b", "2")])).unwrap();
        let first = std::fs::read_link(dir.join("..data")).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).unwrap(), "2");
        // Unchanged content writes nothing.
        write_files(&dir, &files(&[("a", "1"), ("sub/b", "2")])).unwrap();
        assert_eq!(std::fs::read_link(dir.join("..data")).unwrap(), first);
        // An update swaps the link; names gone from the volume go, and so does the old version.
        write_files(&dir, &files(&[("a", "3")])).unwrap();
        assert_ne!(std::fs::read_link(dir.join("..data")).unwrap(), first);
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "3");
        assert!(!dir.join("sub").exists());
        assert!(!dir.join(&first).exists());
        assert!(write_files(&dir, &files(&[("../x", "no")])).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sub_path_exprs_expand_from_the_environment_and_refuse_escapes() {
        let envs = [
            env("POD", "web-0"),
            env("ABS", "/etc"),
            env("UP", "../x"),
            env("EMPTY", ""),
        ];
        let ok = sub_path(&mount(None, Some("logs/$(POD)")), &envs).unwrap();
        assert_eq!(ok.as_deref(), Some("logs/web-0"));
        assert_eq!(
            sub_path(&mount(Some("a/b"), None), &envs)
                .unwrap()
                .as_deref(),
            Some("a/b")
        );
        assert_eq!(sub_path(&mount(None, None), &envs).unwrap(), None);
        let err = |m| sub_path(&m, &envs).unwrap_err().to_string();
        assert!(err(mount(None, Some("$(ABS)"))).contains("must not be an absolute path"));
        assert!(err(mount(None, Some("$(UP)"))).contains("must not contain '..'"));
        assert!(err(mount(Some("/abs"), None)).contains("must not be an absolute path"));
        assert!(
            err(mount(None, Some("$(NOPE)/$(EMPTY)"))).contains("missing value for EMPTY, NOPE")
        );
    }
}
