//! The PersistentVolume binder (upstream's `persistentvolume-binder`, in outline): binds each
//! pending claim to a volume, keeps the phases of both, and asks a class's provisioner for a
//! volume when none fits.
//!
//! A claim naming a volume (`spec.volumeName`) gets that one; otherwise a volume pre-bound to
//! the claim (its `claimRef`, as a provisioner makes it), else the smallest `Available` volume
//! of the same class and volume mode, with all the requested access modes, enough capacity,
//! labels matching the claim's selector and, for a class that waits for its first consumer,
//! node affinity admitting the node the scheduler chose (`volume.kubernetes.io/selected-node`).
//! A claim no volume fits, of a class with a provisioner, is annotated
//! `volume.kubernetes.io/storage-provisioner` (once it has a node, for such a class). Volumes
//! are `Available`, `Bound`, or `Released` once their claim is gone; a bound claim whose volume
//! is gone is `Lost`. Each waiting claim gets an Event saying why (once per reason).

use crate::driver::Driver;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use minik8s_events::{Recorder, Type};
use minik8s_types::Quantity;
use minik8s_types::storage::{
    BETA_STORAGE_PROVISIONER, BIND_COMPLETED, BOUND_BY_CONTROLLER, SELECTED_NODE,
    STORAGE_PROVISIONER,
};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// A claim's storage class (`""`: none).
pub fn claim_class(c: &PersistentVolumeClaim) -> &str {
    c.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("")
}

/// A claim's StorageClass among `classes` (if it exists) and whether binding waits for the
/// first consumer (`WaitForFirstConsumer`).
pub fn class_of(
    c: &PersistentVolumeClaim,
    classes: &Store<StorageClass>,
) -> (Option<Arc<StorageClass>>, bool) {
    let name = claim_class(c);
    let class = classes.state().into_iter().find(|k| k.name_any() == name);
    let delayed = class
        .as_ref()
        .is_some_and(|k| k.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
    (class, delayed)
}

fn volume_class(v: &PersistentVolume) -> &str {
    v.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("")
}

fn storage(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Quantity {
    q.and_then(|q| Quantity::parse(&q.0).ok())
        .unwrap_or(Quantity::ZERO)
}

fn requested(c: &PersistentVolumeClaim) -> Quantity {
    storage(
        c.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage")),
    )
}

fn capacity(v: &PersistentVolume) -> Quantity {
    storage(
        v.spec
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage")),
    )
}

/// Whether a volume's node affinity admits `node` (no affinity: any node).
pub fn admits(affinity: Option<&VolumeNodeAffinity>, node: &Node) -> bool {
    affinity
        .and_then(|a| a.required.as_ref())
        .is_none_or(|required| crate::util::selector_matches(required, node))
}

/// Whether `v`'s claim reference names `c` (by uid when it has one).
pub fn claimed_by(v: &PersistentVolume, c: &PersistentVolumeClaim) -> bool {
    v.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| {
            r.name == c.metadata.name
                && r.namespace == c.metadata.namespace
                && r.uid
                    .as_ref()
                    .is_none_or(|u| Some(u) == c.metadata.uid.as_ref())
        })
}

/// Whether an unclaimed volume satisfies a claim: not being deleted, class, volume mode,
/// access modes, capacity, selector and (when `node` is given) node affinity.
pub fn fits(v: &PersistentVolume, c: &PersistentVolumeClaim, node: Option<&Node>) -> bool {
    let (Some(vs), Some(cs)) = (v.spec.as_ref(), c.spec.as_ref()) else {
        return false;
    };
    if v.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let mode = |m: Option<&String>| m.map_or("Filesystem", String::as_str).to_owned();
    let have = vs.access_modes.clone().unwrap_or_default();
    cs.access_modes.iter().flatten().all(|m| have.contains(m))
        && volume_class(v) == claim_class(c)
        && mode(vs.volume_mode.as_ref()) == mode(cs.volume_mode.as_ref())
        && capacity(v) >= requested(c)
        && cs
            .selector
            .as_ref()
            .is_none_or(|s| crate::util::Selector::new(s).matches(v.metadata.labels.as_ref()))
        && node.is_none_or(|n| admits(vs.node_affinity.as_ref(), n))
}

/// The volume for a pending claim, if one fits: one pre-bound to it first, else the smallest
/// available that fits.
pub fn best_match<'a>(
    c: &PersistentVolumeClaim,
    volumes: &'a [Arc<PersistentVolume>],
    node: Option<&Node>,
) -> Option<&'a Arc<PersistentVolume>> {
    if let Some(v) = volumes.iter().find(|v| claimed_by(v, c)) {
        return Some(v);
    }
    volumes
        .iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .filter(|v| v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_none())
        .filter(|v| fits(v, c, node))
        .min_by_key(|v| (capacity(v), v.name_any()))
}

fn volume_phase(v: &PersistentVolume) -> &str {
    v.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn claim_phase(c: &PersistentVolumeClaim) -> &str {
    c.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// The phase a volume should have given the claims (`None`: leave it).
pub fn wanted_volume_phase(
    v: &PersistentVolume,
    claims: &HashMap<(String, String), Arc<PersistentVolumeClaim>>,
) -> &'static str {
    let Some(r) = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return "Available";
    };
    let key = (
        r.namespace.clone().unwrap_or_default(),
        r.name.clone().unwrap_or_default(),
    );
    let claim = claims.get(&key);
    match (&r.uid, claim) {
        // Pre-bound to a claim that binds it later (or does not exist yet).
        (None, _) => "Available",
        (Some(uid), Some(c)) if c.metadata.uid.as_ref() == Some(uid) => {
            let named = c.spec.as_ref().and_then(|s| s.volume_name.as_deref());
            if named.is_none_or(|n| n.is_empty() || Some(n) == v.metadata.name.as_deref()) {
                "Bound"
            } else {
                "Released"
            }
        }
        (Some(_), _) => "Released",
    }
}

/// The binder's state: its stores, which reason each waiting claim was last told, and the
/// volumes it bound that the cache does not show bound yet.
struct Binder {
    client: Client,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    nodes: Store<Node>,
    recorder: Recorder,
    told: Mutex<HashMap<String, String>>,
    /// Volume name → the uid of the claim it was just bound to.
    taken: Mutex<HashMap<String, String>>,
}

/// Runs the binder until `shutdown`: claims (one at a time, as they share the volumes) when
/// they, a volume or a class change; volumes' phases when they or their claims change.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let claims = Driver::<PersistentVolumeClaim>::new("persistentvolume-binder", &informers).await;
    let volumes = Driver::<PersistentVolume>::new("persistentvolume-binder", &informers).await;
    let b = Arc::new(Binder {
        recorder: Recorder::new(client.clone(), "persistentvolume-controller", None),
        client,
        claims: claims.store(),
        volumes: volumes.store(),
        classes: informers.all::<StorageClass>().await,
        nodes: informers.all::<Node>().await,
        told: Mutex::default(),
        taken: Mutex::default(),
    });
    // A volume change concerns its claim and every claim still waiting for one.
    let waiting = b.claims.clone();
    let claims = claims
        .one_at_a_time()
        .watches::<PersistentVolume, _>(move |v| {
            let bound_to = v
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| {
                    Some(ObjectRef::new(r.name.as_deref()?).within(r.namespace.as_deref()?))
                });
            waiting
                .state()
                .iter()
                .filter(|c| claim_phase(c) != "Bound")
                .map(|c| ObjectRef::from(c.as_ref()))
                .chain(bound_to)
                .collect::<Vec<_>>()
        })
        .watches_all::<StorageClass>();
    // A claim change concerns the volumes that name it or that it names.
    let all_volumes = b.volumes.clone();
    let volumes = volumes.watches::<PersistentVolumeClaim, _>(move |c| {
        let named = c.spec.as_ref().and_then(|s| s.volume_name.clone());
        all_volumes
            .state()
            .iter()
            .filter(|v| claimed_by(v, &c) || named.as_deref() == v.metadata.name.as_deref())
            .map(|v| ObjectRef::from(v.as_ref()))
            .collect::<Vec<_>>()
    });
    tokio::join!(
        claims.run(sync_claim, b.clone(), shutdown.clone()),
        volumes.run(sync_volume, b, shutdown),
    );
}

/// Sets a volume's phase from its claim (Available, Bound or Released).
async fn sync_volume(v: Arc<PersistentVolume>, b: Arc<Binder>) -> crate::Result<Action> {
    let claims: HashMap<(String, String), Arc<PersistentVolumeClaim>> = b
        .claims
        .state()
        .into_iter()
        .map(|c| ((c.namespace().unwrap_or_default(), c.name_any()), c))
        .collect();
    let want = wanted_volume_phase(&v, &claims);
    if volume_phase(&v) != want && !(volume_phase(&v) == "Released" && want == "Bound") {
        Api::<PersistentVolume>::all(b.client.clone())
            .patch_status(
                &v.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"phase": want}})),
            )
            .await?;
    }
    Ok(Action::await_change())
}

/// Binds a claim to a volume, asks its class's provisioner for one, or says why it waits; a
/// bound claim whose volume is gone is Lost.
async fn sync_claim(c: Arc<PersistentVolumeClaim>, b: Arc<Binder>) -> crate::Result<Action> {
    let live: std::collections::HashSet<String> =
        b.claims.state().iter().filter_map(|c| c.uid()).collect();
    b.told
        .lock()
        .expect("told")
        .retain(|uid, _| live.contains(uid));
    if c.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let volumes = b.usable_volumes(&c);
    let named = c
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|n| !n.is_empty());
    if claim_phase(&c) == "Bound" {
        if let Some(n) = &named
            && !b.volumes.state().iter().any(|v| v.name_any() == *n)
        {
            b.claim_status(&c, json!({"phase": "Lost"})).await?;
            b.tell(
                &c,
                Type::Warning,
                "ClaimLost",
                "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
            );
        }
        return Ok(Action::await_change());
    }
    b.bind_claim(&c, named, &volumes).await?;
    Ok(Action::await_change())
}

impl Binder {
    /// The volumes in the cache, less those this binder just bound to another claim that the
    /// cache does not show bound yet (upstream's assume cache).
    fn usable_volumes(&self, c: &PersistentVolumeClaim) -> Vec<Arc<PersistentVolume>> {
        let volumes = self.volumes.state();
        let mut taken = self.taken.lock().expect("taken");
        taken.retain(|name, uid| {
            volumes.iter().any(|v| {
                v.name_any() == *name
                    && v.spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .and_then(|r| r.uid.as_ref())
                        != Some(uid)
            })
        });
        let mine = c.uid().unwrap_or_default();
        volumes
            .into_iter()
            .filter(|v| taken.get(&v.name_any()).is_none_or(|uid| *uid == mine))
            .collect()
    }

    async fn bind_claim(
        &self,
        c: &PersistentVolumeClaim,
        named: Option<String>,
        volumes: &[Arc<PersistentVolume>],
    ) -> crate::Result<()> {
        let (class, delayed) = class_of(c, &self.classes);
        let selected = c.annotations().get(SELECTED_NODE).cloned();
        let node = selected
            .as_ref()
            .and_then(|n| self.nodes.state().into_iter().find(|x| x.name_any() == *n));
        let chosen = match &named {
            Some(n) => match volumes.iter().find(|v| v.name_any() == *n) {
                None => {
                    let msg = format!("volume \"{n}\" not found");
                    self.tell(c, Type::Warning, "FailedBinding", &msg);
                    return Ok(());
                }
                Some(v)
                    if v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some()
                        && !claimed_by(v, c) =>
                {
                    let msg = format!("volume \"{n}\" already bound to a different claim.");
                    self.tell(c, Type::Warning, "FailedBinding", &msg);
                    return Ok(());
                }
                Some(v) => Some(v.clone()),
            },
            None if delayed && node.is_none() => {
                // Pre-bound volumes still bind; others wait for the scheduler's node.
                volumes.iter().find(|v| claimed_by(v, c)).cloned()
            }
            None => best_match(c, volumes, node.as_deref()).cloned(),
        };
        let Some(v) = chosen else {
            return self
                .no_volume(c, class.as_deref(), delayed, &selected)
                .await;
        };
        self.bind(c, &v).await
    }

    /// No volume fits `c`: ask the class's provisioner, or say why it waits.
    async fn no_volume(
        &self,
        c: &PersistentVolumeClaim,
        class: Option<&StorageClass>,
        delayed: bool,
        selected: &Option<String>,
    ) -> crate::Result<()> {
        let class_name = claim_class(c);
        let Some(class) = class else {
            if class_name.is_empty() {
                let msg =
                    "no persistent volumes available for this claim and no storage class is set";
                self.tell(c, Type::Normal, "FailedBinding", msg);
            } else {
                let msg = format!("storageclass.storage.k8s.io \"{class_name}\" not found");
                self.tell(c, Type::Warning, "ProvisioningFailed", &msg);
            }
            return Ok(());
        };
        if delayed && selected.is_none() {
            let msg = "waiting for first consumer to be created before binding";
            self.tell(c, Type::Normal, "WaitForFirstConsumer", msg);
            return Ok(());
        }
        if class.provisioner == "kubernetes.io/no-provisioner" {
            let msg = "no volume plugin matched name: kubernetes.io/no-provisioner";
            self.tell(c, Type::Normal, "FailedBinding", msg);
            return Ok(());
        }
        if c.annotations().get(STORAGE_PROVISIONER) != Some(&class.provisioner) {
            let patch = json!({"metadata": {"annotations": {
                STORAGE_PROVISIONER: class.provisioner,
                BETA_STORAGE_PROVISIONER: class.provisioner,
            }}});
            Api::<PersistentVolumeClaim>::namespaced(
                self.client.clone(),
                &c.namespace().unwrap_or_default(),
            )
            .patch(
                &c.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        }
        let msg = format!(
            "Waiting for a volume to be created either by the external provisioner '{}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.",
            class.provisioner
        );
        self.tell(c, Type::Normal, "ExternalProvisioning", &msg);
        Ok(())
    }

    /// Binds `c` to `v`: the volume's claim reference first, then the claim's volume name
    /// and phases (upstream's order, so a crash in between leaves a pre-bound volume).
    async fn bind(&self, c: &PersistentVolumeClaim, v: &PersistentVolume) -> crate::Result<()> {
        let pv_api: Api<PersistentVolume> = Api::all(self.client.clone());
        let ns = c.namespace().unwrap_or_default();
        let pre_bound = v
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .is_some_and(|r| r.uid.is_some());
        if !pre_bound {
            let mut patch = json!({"spec": {"claimRef": {
                "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": ns, "name": c.name_any(), "uid": c.uid(),
                "resourceVersion": c.resource_version(),
            }}});
            if v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_none() {
                patch["metadata"] = json!({"annotations": {BOUND_BY_CONTROLLER: "yes"}});
            }
            pv_api
                .patch(
                    &v.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
            self.taken
                .lock()
                .expect("taken")
                .insert(v.name_any(), c.uid().unwrap_or_default());
        }
        pv_api
            .patch_status(
                &v.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"phase": "Bound"}})),
            )
            .await?;
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let by_controller = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty);
        let mut annotations = json!({BIND_COMPLETED: "yes"});
        if by_controller {
            annotations[BOUND_BY_CONTROLLER] = json!("yes");
        }
        let patch = json!({
            "metadata": {"annotations": annotations},
            "spec": {"volumeName": v.name_any()},
        });
        claims
            .patch(
                &c.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        let vs = v.spec.clone().unwrap_or_default();
        self.claim_status(
            c,
            json!({"phase": "Bound", "accessModes": vs.access_modes, "capacity": vs.capacity}),
        )
        .await?;
        tracing::info!(claim = %crate::util::key(c), volume = %v.name_any(), "bound");
        Ok(())
    }

    async fn claim_status(
        &self,
        c: &PersistentVolumeClaim,
        status: serde_json::Value,
    ) -> crate::Result<()> {
        Api::<PersistentVolumeClaim>::namespaced(
            self.client.clone(),
            &c.namespace().unwrap_or_default(),
        )
        .patch_status(
            &c.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await?;
        Ok(())
    }

    /// Records an Event on the claim unless it was told the same already.
    fn tell(&self, c: &PersistentVolumeClaim, type_: Type, reason: &str, msg: &str) {
        let uid = c.uid().unwrap_or_default();
        let said = format!("{reason}: {msg}");
        {
            let mut told = self.told.lock().expect("told");
            if told.get(&uid) == Some(&said) {
                return;
            }
            told.insert(uid, said);
        }
        self.recorder
            .record(&c.object_ref(&()), type_, reason, msg.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(spec: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "default", "uid": "c1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn volume(name: &str, spec: serde_json::Value) -> Arc<PersistentVolume> {
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"name": name, "labels": {"tier": "fast"}}, "spec": spec}),
            )
            .unwrap(),
        )
    }

    #[test]
    fn the_smallest_fitting_volume_wins_and_a_pre_bound_one_first() {
        let c = claim(
            json!({"accessModes": ["ReadWriteOnce"], "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}}}),
        );
        let vols = vec![
            volume(
                "big",
                json!({"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"]}),
            ),
            volume(
                "small",
                json!({"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"]}),
            ),
            volume(
                "tiny",
                json!({"capacity": {"storage": "500Mi"}, "accessModes": ["ReadWriteOnce"]}),
            ),
            volume(
                "ro",
                json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"]}),
            ),
            volume(
                "classy",
                json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "fast"}),
            ),
        ];
        assert_eq!(best_match(&c, &vols, None).unwrap().name_any(), "small");
        let mut with_pre = vols.clone();
        with_pre.push(volume(
            "mine",
            json!({"capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteOnce"],
            "claimRef": {"namespace": "default", "name": "data"}}),
        ));
        assert_eq!(best_match(&c, &with_pre, None).unwrap().name_any(), "mine");
        let picky = claim(
            json!({"accessModes": ["ReadWriteOnce"], "storageClassName": "",
            "selector": {"matchLabels": {"tier": "slow"}},
            "resources": {"requests": {"storage": "1Gi"}}}),
        );
        assert!(best_match(&picky, &vols, None).is_none());
    }

    #[test]
    fn node_affinity_limits_a_delayed_claim() {
        let c = claim(
            json!({"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
            "resources": {"requests": {"storage": "1Gi"}}}),
        );
        let v = volume(
            "local-a",
            json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "local", "local": {"path": "/x"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["a"]}]}]}}}),
        );
        let node = |name: &str| -> Node {
            serde_json::from_value(json!({"metadata": {"name": name,
                "labels": {"kubernetes.io/hostname": name}}}))
            .unwrap()
        };
        assert!(fits(&v, &c, Some(&node("a"))));
        assert!(!fits(&v, &c, Some(&node("b"))));
    }

    #[test]
    fn volume_phases_follow_their_claims() {
        let c = Arc::new(claim(json!({"volumeName": "v"})));
        let claims = HashMap::from([(("default".to_owned(), "data".to_owned()), c)]);
        let bound = volume(
            "v",
            json!({"claimRef": {"namespace": "default", "name": "data", "uid": "c1"}}),
        );
        assert_eq!(wanted_volume_phase(&bound, &claims), "Bound");
        let stale = volume(
            "v",
            json!({"claimRef": {"namespace": "default", "name": "data", "uid": "old"}}),
        );
        assert_eq!(wanted_volume_phase(&stale, &claims), "Released");
        assert_eq!(wanted_volume_phase(&bound, &HashMap::new()), "Released");
        assert_eq!(
            wanted_volume_phase(&volume("v", json!({})), &claims),
            "Available"
        );
    }
}
