//! Container logs as the kubelet serves them: the CRI log file format (`<RFC 3339 time>
//! <stream> <P|F> <text>`, partial lines joined) turned back into what the container wrote,
//! with upstream's options (tail, timestamps, since, limitBytes, follow). Docker's json-file
//! lines (`{"log":…,"stream":…,"time":…}`, the Docker runtime's logs) read the same way, as
//! upstream's kubelet reads both.

/// One line a container wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// When the runtime logged it (RFC 3339 with nanoseconds).
    pub time: String,
    /// The text, with its newline if the container wrote one.
    pub text: String,
}

/// One entry of a log file: its time, whether the line goes on in the next entry, and its
/// text (without the newline that ends a line).
fn entry(line: &str) -> Option<(String, bool, String)> {
    if line.starts_with('{') {
        #[derive(serde::Deserialize)]
        struct Docker {
            log: String,
            time: String,
        }
        let d: Docker = serde_json::from_str(line).ok()?;
        return Some(match d.log.strip_suffix('\n') {
            Some(text) => (d.time, false, text.to_owned()),
            None => (d.time, true, d.log),
        });
    }
    let mut parts = line.splitn(4, ' ');
    let (Some(time), Some(_stream), Some(tag)) = (parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    Some((
        time.to_owned(),
        tag != "F",
        parts.next().unwrap_or("").to_owned(),
    ))
}

/// Parses log text (CRI or Docker's json-file) into whole lines; a trailing partial line
/// (not ended yet) is returned separately, with the count of bytes consumed.
pub fn parse(text: &str) -> (Vec<Line>, usize) {
    let mut out = Vec::new();
    let mut partial = String::new();
    let mut first_time = String::new();
    let mut consumed = 0;
    let mut pos = 0;
    for raw in text.split_inclusive('\n') {
        pos += raw.len();
        if !raw.ends_with('\n') {
            break;
        }
        let Some((time, goes_on, content)) = entry(raw.trim_end_matches('\n')) else {
            consumed = pos;
            continue;
        };
        if partial.is_empty() {
            first_time = time;
        }
        partial.push_str(&content);
        if !goes_on {
            out.push(Line {
                time: std::mem::take(&mut first_time),
                text: std::mem::take(&mut partial) + "\n",
            });
            consumed = pos;
        }
    }
    (out, consumed)
}

/// The line still being written at the end of a log (the text after what [`parse`]
/// consumed): its partial entries joined, without a newline. Upstream shows partial output at
/// once, so a container whose last output has no newline (`printf abc`) still shows it.
pub fn unfinished(rest: &str) -> Option<Line> {
    let mut line: Option<Line> = None;
    for raw in rest.split_inclusive('\n').filter(|r| r.ends_with('\n')) {
        let Some((time, _, content)) = entry(raw.trim_end_matches('\n')) else {
            continue;
        };
        line.get_or_insert_with(|| Line {
            time,
            text: String::new(),
        })
        .text
        .push_str(&content);
    }
    line
}

/// What the client asked for.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Only the last N lines.
    pub tail: Option<usize>,
    /// Prefix each line with its time.
    pub timestamps: bool,
    /// Only lines at or after this time (RFC 3339).
    pub since: Option<jiff::Timestamp>,
    /// Stop after this many bytes.
    pub limit_bytes: Option<usize>,
}

impl Options {
    /// The options of a `containerLogs` request's query (`tailLines`, `timestamps`,
    /// `sinceTime` or `sinceSeconds`, `limitBytes`).
    pub fn from_query(q: &std::collections::HashMap<String, String>) -> Options {
        let truthy = |k: &str| {
            q.get(k)
                .is_some_and(|v| minik8s_types::parse_bool(v) == Some(true))
        };
        let since = q
            .get("sinceTime")
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .or_else(|| {
                q.get("sinceSeconds")
                    .and_then(|n| n.parse::<i64>().ok())
                    .map(|n| jiff::Timestamp::now() - jiff::SignedDuration::from_secs(n))
            });
        Options {
            tail: q.get("tailLines").and_then(|n| n.parse().ok()),
            timestamps: truthy("timestamps"),
            since,
            limit_bytes: q.get("limitBytes").and_then(|n| n.parse().ok()),
        }
    }
}

/// Renders lines as the client gets them.
pub fn render(lines: &[Line], opts: &Options) -> String {
    let selected: Vec<&Line> = lines
        .iter()
        .filter(|l| match (&opts.since, l.time.parse::<jiff::Timestamp>()) {
            (Some(since), Ok(t)) => t >= *since,
            _ => true,
        })
        .collect();
    let start = opts.tail.map_or(0, |n| selected.len().saturating_sub(n));
    let mut out = String::new();
    for l in &selected[start..] {
        if opts.timestamps {
            out.push_str(&l.time);
            out.push(' ');
        }
        out.push_str(&l.text);
    }
    if let Some(limit) = opts.limit_bytes
        && out.len() > limit
    {
        let mut cut = limit;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026-01-01T00:00:01.000000001Z stdout F one\n\
2026-01-01T00:00:02.000000001Z stderr P tw\n\
2026-01-01T00:00:02.500000001Z stderr F o\n\
2026-01-01T00:00:03.000000001Z stdout F three\n\
2026-01-01T00:00:04.000000001Z stdout P fo";

    #[test]
    fn partial_lines_are_joined_and_an_unfinished_one_waits() {
        let (lines, consumed) = parse(LOG);
        let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(texts, ["one\n", "two\n", "three\n"]);
        assert_eq!(
            &LOG[consumed..],
            "2026-01-01T00:00:04.000000001Z stdout P fo"
        );
    }

    #[test]
    fn dockers_json_file_lines_read_as_cri_lines_do() {
        let text = concat!(
            r#"{"log":"one\n","stream":"stdout","time":"2026-11-28T17:29:39.1Z"}"#,
            "\n",
            r#"{"log":"tw","stream":"stderr","time":"2026-11-28T17:29:40.1Z"}"#,
            "\n",
            r#"{"log":"o\n","stream":"stderr","time":"2026-11-28T17:29:40.2Z"}"#,
            "\n",
            r#"{"log":"thr","stream":"stdout","time":"2026-11-28T17:29:41.1Z"}"#,
            "\n",
        );
        let (lines, consumed) = parse(text);
        assert_eq!(
            lines,
            [
                Line {
                    time: "2026-11-28T17:29:39.1Z".into(),
                    text: "one\n".into()
                },
                Line {
                    time: "2026-11-28T17:29:40.1Z".into(),
                    text: "two\n".into()
                },
            ]
        );
        assert_eq!(
            unfinished(&text[consumed..]).map(|l| l.text).as_deref(),
            Some("thr")
        );
    }

    #[test]
    fn output_without_a_final_newline_is_shown() {
        let log = "2026-01-01T00:00:01.000000001Z stdout F one\n\
2026-01-01T00:00:02.000000001Z stdout P abc\n\
2026-01-01T00:00:02.000000002Z stdout P def\n";
        let (lines, consumed) = parse(log);
        assert_eq!(lines.len(), 1);
        let last = unfinished(&log[consumed..]).expect("the unfinished line");
        assert_eq!(last.text, "abcdef");
        assert_eq!(last.time, "2026-01-01T00:00:02.000000001Z");
        assert!(unfinished("").is_none());
    }

    #[test]
    fn tail_timestamps_since_and_limit_bytes_select_as_upstream() {
        let (lines, _) = parse(LOG);
        let tail = Options {
            tail: Some(2),
            ..Default::default()
        };
        assert_eq!(render(&lines, &tail), "two\nthree\n");
        let stamped = Options {
            tail: Some(1),
            timestamps: true,
            ..Default::default()
        };
        assert_eq!(
            render(&lines, &stamped),
            "2026-01-01T00:00:03.000000001Z three\n"
        );
        let since = Options {
            since: "2026-01-01T00:00:02Z".parse().ok(),
            ..Default::default()
        };
        assert_eq!(render(&lines, &since), "two\nthree\n");
        let limited = Options {
            limit_bytes: Some(5),
            ..Default::default()
        };
        assert_eq!(render(&lines, &limited), "one\nt");
    }
}
