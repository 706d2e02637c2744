//! Which requests an admission webhook or policy sees: rules (operations × groups × versions
//! × resources × scope, and for policies resource names and exclusions), then the object
//! and namespace selectors, as upstream's `admission/plugin/webhook/predicates` and the
//! policies' `matchConstraints`.

use super::Operation;
use crate::context::Ctx;
use crate::error::ApiResult;
use minik8s_storage::Store;
use minik8s_types::LabelSelector;
use serde_json::Value;

/// One rule: operations × groups × versions × resources (with subresources) × scope, and
/// (policies' `NamedRuleWithOperations`) the names it is limited to.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    operations: Vec<String>,
    groups: Vec<String>,
    versions: Vec<String>,
    resources: Vec<String>,
    scope: String,
    names: Vec<String>,
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    crate::object::strings_at(v, &format!("/{key}"))
}

impl Rule {
    pub(crate) fn from(v: &Value) -> Self {
        Rule {
            operations: strings(v, "operations"),
            groups: strings(v, "apiGroups"),
            versions: strings(v, "apiVersions"),
            resources: strings(v, "resources"),
            scope: v
                .get("scope")
                .and_then(Value::as_str)
                .unwrap_or("*")
                .to_owned(),
            names: strings(v, "resourceNames"),
        }
    }

    fn matches(&self, op: Operation, ctx: &Ctx, name: &str) -> bool {
        let any = |list: &[String], x: &str| list.iter().any(|i| i == "*" || i == x);
        let resource_ok = self.resources.iter().any(|r| {
            let (res, sub) = r.split_once('/').unwrap_or((r, ""));
            let want_sub = ctx.req.subresource.as_deref().unwrap_or_default();
            (res == "*" || res == ctx.res.plural) && (sub == "*" || sub == want_sub)
        });
        let scope_ok = match self.scope.as_str() {
            "Cluster" => !ctx.res.namespaced,
            "Namespaced" => ctx.res.namespaced,
            _ => true,
        };
        any(&self.operations, op.as_str())
            && any(&self.groups, &ctx.res.group)
            && any(&self.versions, &ctx.res.version)
            && resource_ok
            && scope_ok
            && (self.names.is_empty() || self.names.iter().any(|n| n == name))
    }
}

/// Rules and selectors: a webhook's, a policy's `matchConstraints` or a binding's
/// `matchResources`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Matcher {
    pub(crate) rules: Vec<Rule>,
    pub(crate) exclude: Vec<Rule>,
    pub(crate) namespace_selector: LabelSelector,
    pub(crate) object_selector: LabelSelector,
}

fn rules(v: &Value, key: &str) -> Vec<Rule> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(Rule::from)
        .collect()
}

impl Matcher {
    /// A webhook's `rules` and selectors.
    pub(crate) fn webhook(v: &Value) -> Self {
        Matcher {
            rules: rules(v, "rules"),
            ..Self::selectors(v)
        }
    }

    /// A policy's `matchConstraints` or a binding's `matchResources`.
    pub(crate) fn resources(v: &Value) -> Self {
        Matcher {
            rules: rules(v, "resourceRules"),
            exclude: rules(v, "excludeResourceRules"),
            ..Self::selectors(v)
        }
    }

    fn selectors(v: &Value) -> Self {
        let selector = |k: &str| {
            v.get(k)
                .map(LabelSelector::from_json)
                .transpose()
                .ok()
                .flatten()
                .unwrap_or_default()
        };
        Matcher {
            namespace_selector: selector("namespaceSelector"),
            object_selector: selector("objectSelector"),
            ..Default::default()
        }
    }

    /// Whether the request matches: a rule and no exclusion, then the selectors. A binding
    /// without rules (`all_when_no_rules`) matches whatever its selectors let through.
    pub(crate) async fn matches(
        &self,
        ctx: &Ctx,
        op: Operation,
        obj: Option<&Value>,
        old: Option<&Value>,
        all_when_no_rules: bool,
    ) -> ApiResult<bool> {
        // Admission configuration itself is never sent to webhooks or policies (upstream's
        // `IsExemptAdmissionConfigurationResource`): a broken one could not be removed
        // otherwise.
        if ctx.res.group == "admissionregistration.k8s.io" {
            return Ok(false);
        }
        let name = obj
            .or(old)
            .and_then(|o| crate::object::meta_str(o, "name"))
            .unwrap_or(ctx.name());
        let ruled = (all_when_no_rules && self.rules.is_empty())
            || self.rules.iter().any(|r| r.matches(op, ctx, name));
        if !ruled || self.exclude.iter().any(|r| r.matches(op, ctx, name)) {
            return Ok(false);
        }
        let labels_of = |o: Option<&Value>| o.and_then(|o| o.pointer("/metadata/labels")).cloned();
        // The object selector matches when the new or the old object (whichever exist) does.
        if !self.object_selector.is_empty()
            && ![obj, old].into_iter().flatten().any(|o| {
                self.object_selector
                    .matches_json(labels_of(Some(o)).as_ref())
            })
        {
            return Ok(false);
        }
        if self.namespace_selector.is_empty() {
            return Ok(true);
        }
        let is_namespace = ctx.res.strategy.is_namespace();
        let labels = if is_namespace {
            labels_of(obj.or(old))
        } else if ctx.namespace().is_some() {
            labels_of(namespace_object(ctx).await?.as_ref())
        } else {
            // Cluster-scoped objects other than namespaces are never excluded by it.
            return Ok(true);
        };
        Ok(self.namespace_selector.matches_json(labels.as_ref()))
    }
}

/// The stored namespace of a namespaced request, if it exists.
pub(crate) async fn namespace_object(ctx: &Ctx) -> ApiResult<Option<Value>> {
    let Some(ns) = ctx.namespace() else {
        return Ok(None);
    };
    match ctx
        .api
        .store
        .get(&format!("/registry/core/namespaces/{ns}"))
        .await?
    {
        Some(kv) => Ok(Some(crate::object::from_store(&kv)?)),
        None => Ok(None),
    }
}
