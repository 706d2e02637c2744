//! Turning a method, path and query into a typed [`RequestInfo`], as upstream's
//! `RequestInfoFactory` does: which group, version, namespace, resource, name, subresource and verb.

use axum::http::Method;

/// The verb of a resource request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    /// GET one object.
    Get,
    /// GET a collection.
    List,
    /// GET a collection with `watch`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE one object.
    Delete,
    /// DELETE a collection.
    DeleteCollection,
    /// OPTIONS (only proxied: upstream's verb is the lowercased method).
    Options,
}

impl Verb {
    /// The verb's name as discovery and RBAC spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Options => "options",
        }
    }
}

/// A request for a resource (`/api/v1/...` or `/apis/<group>/<version>/...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceRequest {
    /// What is being done.
    pub verb: Verb,
    /// API group ("" for core).
    pub group: String,
    /// API version.
    pub version: String,
    /// Namespace from the path, if any.
    pub namespace: Option<String>,
    /// Plural resource name.
    pub resource: String,
    /// Object name, if the path names one.
    pub name: Option<String>,
    /// Subresource (`status`, `scale`, `log`, …), if any.
    pub subresource: Option<String>,
    /// For the `proxy` subresource, the path after it (`stats/summary`), without the
    /// leading slash; a trailing slash is kept (`/proxy/` gives `/`, `/proxy` nothing).
    pub proxy_path: Option<String>,
    /// Whether the method was HEAD (a [`Verb::Get`] that a proxy passes on as HEAD).
    pub head: bool,
    /// For a list or watch whose field selector requires `metadata.name=N`: N, which
    /// authorization treats as the request's name (upstream's RequestInfoFactory), so a
    /// role limited by `resourceNames` allows watching that one object.
    pub selected_name: Option<String>,
}

/// The name a field selector requires (`metadata.name=N`, alone or among other terms).
fn selected_name(query: Option<&str>) -> Option<String> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query?).ok()?;
    let selector = pairs.into_iter().find(|(k, _)| k == "fieldSelector")?.1;
    selector.split(',').find_map(|term| {
        let (k, v) = term.split_once("==").or_else(|| {
            let (k, v) = term.split_once('=')?;
            (!k.ends_with('!')).then_some((k, v))
        })?;
        (k.trim() == "metadata.name" && !v.trim().is_empty()).then(|| v.trim().to_owned())
    })
}

/// What a request is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestInfo {
    /// A resource request.
    Resource(ResourceRequest),
    /// Anything else (`/version`, `/healthz`, `/api`, `/apis/<group>`, `/openapi/v2`, …).
    NonResource {
        /// The lower-cased HTTP verb (`get`, `post`, …).
        verb: String,
        /// The path.
        path: String,
    },
}

/// Whether the query asks for a watch (`watch=true`, `watch=1`).
pub fn wants_watch(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&').any(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            k == "watch" && minik8s_types::parse_bool(v) == Some(true)
        })
    })
}

/// Parses a request the way upstream's RequestInfoFactory does.
pub fn parse(method: &Method, path: &str, query: Option<&str>) -> RequestInfo {
    let non_resource = || RequestInfo::NonResource {
        verb: method.as_str().to_ascii_lowercase(),
        path: path.to_owned(),
    };
    let parts: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .collect();
    let (group, version, mut rest) = match parts.as_slice() {
        ["api", version, rest @ ..] if !rest.is_empty() => ("", *version, rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
        _ => return non_resource(),
    };
    let mut watch_prefix = false;
    if rest.first() == Some(&"watch") {
        watch_prefix = true;
        rest = &rest[1..];
    }
    let mut namespace = None;
    let mut scoped = false;
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        namespace = Some(rest[1].to_owned());
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest = &rest[2..];
            scoped = true;
        }
    }
    let Some(resource) = rest.first() else {
        return non_resource();
    };
    // Only `proxy` takes a path after the subresource (`nodes/n/proxy/stats/summary`).
    let mut proxy_path = None;
    if rest.get(2) == Some(&"proxy") {
        let after = rest[3..].join("/");
        let trailing = path.ends_with('/');
        proxy_path = Some(if trailing { format!("{after}/") } else { after });
        rest = &rest[..3];
    }
    if rest.len() > 3 {
        return non_resource();
    }
    let name = rest.get(1).map(|s| s.to_string());
    let subresource = rest.get(2).map(|s| s.to_string());
    // A namespace object's path names the namespace as the object, not as its scope
    // (`/namespaces/x/namespaces` is a namespaced path, which the scope check refuses).
    if *resource == "namespaces" && !scoped {
        namespace = None;
    }
    let verb = match *method {
        Method::GET | Method::HEAD => match (&name, watch_prefix || wants_watch(query)) {
            (_, true) => Verb::Watch,
            (Some(_), false) => Verb::Get,
            (None, false) => Verb::List,
        },
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::PATCH => Verb::Patch,
        Method::DELETE if name.is_some() => Verb::Delete,
        Method::DELETE => Verb::DeleteCollection,
        Method::OPTIONS if proxy_path.is_some() => Verb::Options,
        _ => return non_resource(),
    };
    let selected_name = matches!(verb, Verb::List | Verb::Watch)
        .then(|| selected_name(query))
        .flatten();
    RequestInfo::Resource(ResourceRequest {
        verb,
        group: group.to_owned(),
        version: version.to_owned(),
        namespace,
        resource: resource.to_string(),
        name,
        subresource,
        proxy_path,
        selected_name,
        head: *method == Method::HEAD,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(
        verb: Verb,
        group: &str,
        ns: Option<&str>,
        resource: &str,
        name: Option<&str>,
        sub: Option<&str>,
    ) -> RequestInfo {
        RequestInfo::Resource(ResourceRequest {
            verb,
            group: group.into(),
            version: "v1".into(),
            namespace: ns.map(Into::into),
            resource: resource.into(),
            name: name.map(Into::into),
            subresource: sub.map(Into::into),
            proxy_path: None,
            selected_name: None,
            head: false,
        })
    }

    #[test]
    fn a_field_selector_on_the_name_names_a_list_for_authorization() {
        let q = Some("fieldSelector=metadata.name%3Dextension-apiserver-authentication&watch=true");
        let RequestInfo::Resource(r) =
            parse(&Method::GET, "/api/v1/namespaces/kube-system/configmaps", q)
        else {
            panic!("a resource request")
        };
        assert_eq!(r.verb, Verb::Watch);
        assert_eq!(r.name, None);
        assert_eq!(
            r.selected_name.as_deref(),
            Some("extension-apiserver-authentication")
        );
        assert_eq!(
            selected_name(Some("fieldSelector=metadata.name!%3Dx")),
            None
        );
        assert_eq!(
            selected_name(Some(
                "fieldSelector=status.phase%3DRunning,metadata.name%3D%3Dp"
            ))
            .as_deref(),
            Some("p")
        );
    }

    #[test]
    fn every_path_form_parses_like_upstream() {
        use Verb::*;
        let g = Method::GET;
        let table: Vec<(Method, &str, Option<&str>, RequestInfo)> = vec![
            (
                g.clone(),
                "/api/v1/pods",
                None,
                res(List, "", None, "pods", None, None),
            ),
            (
                g.clone(),
                "/api/v1/namespaces/default/pods",
                None,
                res(List, "", Some("default"), "pods", None, None),
            ),
            (
                g.clone(),
                "/api/v1/namespaces/default/pods/web",
                None,
                res(Get, "", Some("default"), "pods", Some("web"), None),
            ),
            (
                g.clone(),
                "/api/v1/namespaces/default/pods/web/log",
                None,
                res(Get, "", Some("default"), "pods", Some("web"), Some("log")),
            ),
            (
                g.clone(),
                "/api/v1/namespaces/default/pods",
                Some("watch=1"),
                res(Watch, "", Some("default"), "pods", None, None),
            ),
            (
                g.clone(),
                "/api/v1/watch/namespaces/default/pods",
                None,
                res(Watch, "", Some("default"), "pods", None, None),
            ),
            (
                g.clone(),
                "/api/v1/namespaces/kube-system",
                None,
                res(Get, "", None, "namespaces", Some("kube-system"), None),
            ),
            (
                g.clone(),
                "/api/v1/namespaces/x/namespaces",
                None,
                res(List, "", Some("x"), "namespaces", None, None),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/x/finalize",
                None,
                res(Update, "", None, "namespaces", Some("x"), Some("finalize")),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/x/status",
                None,
                res(Update, "", None, "namespaces", Some("x"), Some("status")),
            ),
            (
                g.clone(),
                "/api/v1/namespaces",
                None,
                res(List, "", None, "namespaces", None, None),
            ),
            (
                Method::POST,
                "/apis/apps/v1/namespaces/ns/deployments",
                None,
                res(Create, "apps", Some("ns"), "deployments", None, None),
            ),
            (
                Method::PATCH,
                "/apis/apps/v1/namespaces/ns/deployments/d/scale",
                None,
                res(
                    Patch,
                    "apps",
                    Some("ns"),
                    "deployments",
                    Some("d"),
                    Some("scale"),
                ),
            ),
            (
                Method::DELETE,
                "/apis/apps/v1/namespaces/ns/deployments",
                None,
                res(
                    DeleteCollection,
                    "apps",
                    Some("ns"),
                    "deployments",
                    None,
                    None,
                ),
            ),
            (
                Method::DELETE,
                "/api/v1/nodes/n1",
                None,
                res(Delete, "", None, "nodes", Some("n1"), None),
            ),
            (
                g.clone(),
                "/apis/apps/v1/deployments",
                Some("watch=true&labelSelector=a%3Db"),
                res(Watch, "apps", None, "deployments", None, None),
            ),
        ];
        for (method, path, query, want) in table {
            assert_eq!(
                parse(&method, path, query),
                want,
                "{method} {path}?{query:?}"
            );
        }
        for path in [
            "/version",
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps",
            "/apis/apps/v1",
            "/openapi/v2",
            "/healthz",
        ] {
            assert!(
                matches!(parse(&g, path, None), RequestInfo::NonResource { .. }),
                "{path}"
            );
        }
    }

    #[test]
    fn watch_query_values_follow_upstream() {
        assert!(wants_watch(Some("watch=1")));
        assert!(wants_watch(Some("limit=5&watch=true")));
        assert!(!wants_watch(Some("watch=false")));
        assert!(!wants_watch(Some("watch=0")));
        assert!(!wants_watch(None));
    }
}
