//! Label and field selectors with upstream syntax and semantics
//! (`k8s.io/apimachinery/pkg/labels` and `pkg/fields`).

use std::collections::BTreeMap;
use std::fmt;

/// A selector that could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectorError(pub String);

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SelectorError {}

/// One label requirement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` / `key==value`.
    Equals(String, String),
    /// `key!=value` (also true when the key is absent).
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also true when the key is absent).
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, get: &dyn Fn(&str) -> Option<String>) -> bool {
        match self {
            Requirement::Equals(k, v) => get(k).as_deref() == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k).as_deref() != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        }
    }
}

/// A label selector: all requirements must hold. The empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    /// The requirements.
    pub requirements: Vec<Requirement>,
}

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, SelectorError> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(SelectorError(format!("unbalanced parenthesis in {s:?}")));
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(SelectorError(format!("unbalanced parenthesis in {s:?}")));
    }
    out.push(&s[start..]);
    Ok(out)
}

fn check_key(key: &str) -> Result<String, SelectorError> {
    let valid = !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if valid {
        Ok(key.to_owned())
    } else {
        Err(SelectorError(format!("invalid label key {key:?}")))
    }
}

fn check_value(v: &str) -> Result<String, SelectorError> {
    let valid = v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(v.to_owned())
    } else {
        Err(SelectorError(format!("invalid label value {v:?}")))
    }
}

fn parse_set(s: &str) -> Result<Vec<String>, SelectorError> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError(format!("expected a (set) in {s:?}")))?;
    inner.split(',').map(|v| check_value(v.trim())).collect()
}

impl LabelSelector {
    /// Parses upstream label selector syntax.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(Self::default());
        }
        let mut requirements = Vec::new();
        for part in split_top(s)? {
            let part = part.trim();
            if part.is_empty() {
                return Err(SelectorError(format!("empty requirement in {s:?}")));
            }
            let req = if let Some(k) = part.strip_prefix('!') {
                Requirement::DoesNotExist(check_key(k.trim())?)
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(check_key(k.trim())?, check_value(v.trim())?)
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement::Equals(check_key(k.trim())?, check_value(v.trim())?)
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement::Equals(check_key(k.trim())?, check_value(v.trim())?)
            } else if let Some(i) = part.find(" notin ") {
                Requirement::NotIn(check_key(part[..i].trim())?, parse_set(&part[i + 7..])?)
            } else if let Some(i) = part.find(" in ") {
                Requirement::In(check_key(part[..i].trim())?, parse_set(&part[i + 4..])?)
            } else {
                Requirement::Exists(check_key(part)?)
            };
            requirements.push(req);
        }
        Ok(LabelSelector { requirements })
    }

    /// Builds a selector from a `metav1.LabelSelector` in JSON (`matchLabels`, `matchExpressions`).
    pub fn from_json(v: &serde_json::Value) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if let Some(m) = v.get("matchLabels").and_then(|m| m.as_object()) {
            for (k, val) in m {
                let val = val.as_str().unwrap_or_default();
                requirements.push(Requirement::Equals(k.clone(), val.to_owned()));
            }
        }
        if let Some(exprs) = v.get("matchExpressions").and_then(|m| m.as_array()) {
            for e in exprs {
                let key = e
                    .get("key")
                    .and_then(|k| k.as_str())
                    .unwrap_or_default()
                    .to_owned();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(|v| v.as_array())
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let op = e
                    .get("operator")
                    .and_then(|o| o.as_str())
                    .unwrap_or_default();
                requirements.push(match op {
                    "In" => Requirement::In(key, values),
                    "NotIn" => Requirement::NotIn(key, values),
                    "Exists" => Requirement::Exists(key),
                    "DoesNotExist" => Requirement::DoesNotExist(key),
                    other => {
                        return Err(SelectorError(format!(
                            "{other:?} is not a valid label selector operator"
                        )));
                    }
                });
            }
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether the selector matches nothing-in-particular (everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether a set of labels satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let get = |k: &str| labels.get(k).cloned();
        self.requirements.iter().all(|r| r.matches(&get))
    }

    /// Whether an object's `metadata.labels` (JSON) satisfies every requirement.
    pub fn matches_json(&self, labels: Option<&serde_json::Value>) -> bool {
        let get = |k: &str| {
            labels
                .and_then(|l| l.get(k))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        self.requirements.iter().all(|r| r.matches(&get))
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// A field selector: `field=value`, `field==value`, `field!=value`, comma-separated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// (field, value, equal?) triples.
    pub terms: Vec<(String, String, bool)>,
}

fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl FieldSelector {
    /// Parses upstream field selector syntax.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        let s = s.trim();
        if s.is_empty() {
            return Ok(Self::default());
        }
        // Split on commas not escaped with a backslash.
        let mut parts = Vec::new();
        let (mut cur, mut escaped) = (String::new(), false);
        for c in s.chars() {
            match c {
                '\\' if !escaped => {
                    escaped = true;
                    cur.push(c);
                    continue;
                }
                ',' if !escaped => parts.push(std::mem::take(&mut cur)),
                _ => cur.push(c),
            }
            escaped = false;
        }
        parts.push(cur);
        for p in parts {
            let (field, value, eq) = if let Some((f, v)) = p.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = p.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = p.split_once('=') {
                (f, v, true)
            } else {
                return Err(SelectorError(format!("invalid field selector: {p:?}")));
            };
            terms.push((field.trim().to_owned(), unescape(value.trim()), eq));
        }
        Ok(FieldSelector { terms })
    }

    /// Whether the selector is empty (matches everything).
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The fields it uses.
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.terms.iter().map(|(f, _, _)| f.as_str())
    }

    /// Whether an object satisfies every term; `get` reads a field's value as text.
    pub fn matches(&self, get: impl Fn(&str) -> String) -> bool {
        self.terms.iter().all(|(f, v, eq)| (get(f) == *v) == *eq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors_parse_and_match_like_upstream() {
        let l = labels(&[("app", "web"), ("tier", "front"), ("env", "prod")]);
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app=web,tier=back", false),
            ("env in (prod, staging)", true),
            ("env notin (prod)", false),
            ("missing notin (a)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app in (web),env", true),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap();
            assert_eq!(s.matches(&l), want, "{sel}");
        }
        for bad in ["app=", "=x", "a in (b", "a in b)", "a b c", "app=we b"] {
            if let Ok(s) = LabelSelector::parse(bad) {
                // "app=" means app has the empty value, which upstream accepts.
                assert_eq!(bad, "app=", "{bad} parsed as {s:?}");
            }
        }
    }

    #[test]
    fn structured_selectors_match_the_same_way() {
        let v = serde_json::json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]
        });
        let s = LabelSelector::from_json(&v).unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("app", "web")])));
        assert_eq!(s.to_string(), "app=web,env in (prod)");
    }

    #[test]
    fn field_selectors_parse_escapes_and_match() {
        let s = FieldSelector::parse("metadata.name=a\\,b,status.phase!=Running").unwrap();
        assert_eq!(s.terms[0], ("metadata.name".into(), "a,b".into(), true));
        let get = |f: &str| match f {
            "metadata.name" => "a,b".to_owned(),
            "status.phase" => "Pending".to_owned(),
            _ => String::new(),
        };
        assert!(s.matches(get));
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
