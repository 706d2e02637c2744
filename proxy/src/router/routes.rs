//! The router's table, one model rendered from both `DNS` objects and `Ingress`es: for a
//! request's host and path, the backend and the path to send. Matching follows the Ingress
//! specification: an exact host beats a wildcard (`*.example.com`, one label), an `Exact`
//! path beats a `Prefix` one, and the longest prefix wins; prefixes match whole path elements
//! (`/foo` matches `/foo` and `/foo/bar`, not `/foobar`). `ImplementationSpecific` is a prefix.

use std::collections::HashMap;

/// How a path matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathType {
    /// The request path equals it.
    Exact,
    /// It is a prefix of the request path, element by element.
    Prefix,
}

/// A port of a Service, by number or name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Port {
    /// `port.number`.
    Number(u16),
    /// `port.name`.
    Name(String),
}

/// Where matching requests go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service.
    pub service: String,
    /// Its port.
    pub port: Port,
}

/// One path of one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The host (`example.com`, `*.example.com`, or empty for any host).
    pub host: String,
    /// The path.
    pub path: String,
    /// How it matches.
    pub path_type: PathType,
    /// Whether the matched prefix is removed before forwarding (the `DNS` kind).
    pub strip: bool,
    /// Where it goes.
    pub backend: Backend,
}

/// The whole table.
#[derive(Clone, Debug, Default)]
pub struct Table {
    /// Routes by host (lower case; `*.x` for wildcards, empty for any).
    hosts: HashMap<String, Vec<Route>>,
    /// Where requests matching no route go (an Ingress's `defaultBackend`).
    pub default: Option<Backend>,
}

/// Whether `prefix` matches `path` element-wise.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        return true;
    }
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

impl Table {
    /// A table of `routes`, with `default` for the rest.
    pub fn new(routes: Vec<Route>, default: Option<Backend>) -> Self {
        let mut hosts: HashMap<String, Vec<Route>> = HashMap::new();
        for r in routes {
            hosts
                .entry(r.host.to_ascii_lowercase())
                .or_default()
                .push(r);
        }
        for list in hosts.values_mut() {
            // Exact before Prefix; longer paths first.
            list.sort_by(|a, b| {
                (b.path_type == PathType::Exact)
                    .cmp(&(a.path_type == PathType::Exact))
                    .then(b.path.len().cmp(&a.path.len()))
            });
        }
        Table { hosts, default }
    }

    /// The hosts with routes (for DNS answers and `/etc/hosts`), without wildcards.
    pub fn host_names(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .hosts
            .keys()
            .filter(|h| !h.is_empty() && !h.starts_with('*'))
            .cloned()
            .collect();
        out.sort();
        out
    }

    fn find<'a>(list: &'a [Route], path: &str) -> Option<&'a Route> {
        list.iter().find(|r| match r.path_type {
            PathType::Exact => r.path == path,
            PathType::Prefix => prefix_matches(&r.path, path),
        })
    }

    /// The backend for a request and the path to send it with.
    pub fn route(&self, host: &str, path: &str) -> Option<(&Backend, String)> {
        let host = host
            .rsplit_once(':')
            .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
            .map_or(host, |(h, _)| h)
            .to_ascii_lowercase();
        let wildcard = host.split_once('.').map(|(_, rest)| format!("*.{rest}"));
        let candidates = [Some(host), wildcard, Some(String::new())];
        for key in candidates.into_iter().flatten() {
            if let Some(r) = self.hosts.get(&key).and_then(|l| Self::find(l, path)) {
                let sent = if r.strip {
                    let rest = &path[r.path.trim_end_matches('/').len()..];
                    if rest.is_empty() {
                        "/".to_owned()
                    } else {
                        rest.to_owned()
                    }
                } else {
                    path.to_owned()
                };
                return Some((&r.backend, sent));
            }
        }
        self.default.as_ref().map(|b| (b, path.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(service: &str) -> Backend {
        Backend {
            namespace: "default".into(),
            service: service.into(),
            port: Port::Number(80),
        }
    }

    fn r(host: &str, path: &str, t: PathType, strip: bool, service: &str) -> Route {
        Route {
            host: host.into(),
            path: path.into(),
            path_type: t,
            strip,
            backend: b(service),
        }
    }

    #[test]
    fn matching_follows_the_ingress_rules_and_dns_paths_are_stripped() {
        use PathType::*;
        let t = Table::new(
            vec![
                r("minik8s.io", "/test1", Prefix, true, "one"),
                r("minik8s.io", "/test2", Prefix, true, "two"),
                r("shop.example", "/", Prefix, false, "root"),
                r("shop.example", "/api", Prefix, false, "api"),
                r("shop.example", "/api/v2", Prefix, false, "v2"),
                r("shop.example", "/api", Exact, false, "exact"),
                r("*.example", "/", Prefix, false, "wild"),
            ],
            Some(b("fallback")),
        );
        let got = |host: &str, path: &str| {
            t.route(host, path)
                .map(|(b, p)| format!("{} {p}", b.service))
                .unwrap_or_default()
        };
        // The DNS kind: the prefix is removed.
        assert_eq!(got("minik8s.io", "/test1"), "one /");
        assert_eq!(got("minik8s.io", "/test1/a/b?x"), "one /a/b?x");
        assert_eq!(got("MINIK8S.io:80", "/test2/"), "two /");
        // Whole elements only.
        assert_eq!(got("minik8s.io", "/test10"), "fallback /test10");
        // Exact beats Prefix; the longest prefix wins.
        assert_eq!(got("shop.example", "/api"), "exact /api");
        assert_eq!(got("shop.example", "/api/x"), "api /api/x");
        assert_eq!(got("shop.example", "/api/v2/y"), "v2 /api/v2/y");
        assert_eq!(got("shop.example", "/apix"), "root /apix");
        // A wildcard covers one label; an exact host wins over it.
        assert_eq!(got("a.example", "/z"), "wild /z");
        assert_eq!(got("a.b.example", "/z"), "fallback /z");
        assert_eq!(got("elsewhere", "/"), "fallback /");
        assert_eq!(t.host_names(), ["minik8s.io", "shop.example"]);
    }
}
