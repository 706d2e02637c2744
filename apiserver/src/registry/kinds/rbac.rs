//! RBAC roles and bindings (upstream's `pkg/registry/rbac/*`): a binding's `roleRef` is fixed
//! once created.

use super::{CreatedAt, Row, Strategy, immutable, list, s};
use crate::error::Cause;
use crate::registry::ResourceInfo;
use serde_json::Value;

/// `rbac.authorization.k8s.io/v1` Role and ClusterRole.
pub struct Role;

impl Strategy for Role {
    fn table(&self, res: &ResourceInfo, o: &Value, row: &mut Row) {
        CreatedAt.table(res, o, row);
    }
}

/// `rbac.authorization.k8s.io/v1` RoleBinding and ClusterRoleBinding.
pub struct RoleBinding;

impl Strategy for RoleBinding {
    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        immutable(new, old, &[("/roleRef", "roleRef")], causes);
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        let of = |kind: &str| {
            list(o, "/subjects")
                .iter()
                .filter(|x| s(x, "/kind") == kind)
                .map(|x| {
                    if kind == "ServiceAccount" {
                        format!("{}/{}", s(x, "/namespace"), s(x, "/name"))
                    } else {
                        s(x, "/name")
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        row.name(o);
        row.col("Role", "string", 0, || {
            format!("{}/{}", s(o, "/roleRef/kind"), s(o, "/roleRef/name"))
        });
        row.age(o);
        row.col("Users", "string", 1, || of("User"));
        row.col("Groups", "string", 1, || of("Group"));
        row.col("ServiceAccounts", "string", 1, || of("ServiceAccount"));
    }
}
