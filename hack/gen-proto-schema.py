#!/usr/bin/env python3
"""Generates apiserver/src/serving/proto/schema.json: for every Kubernetes protobuf message, its fields
(tag, JSON name, wire type, label, message type). Field numbers and types come from the prost
attributes of the k8s-pb crate; JSON names from k8s-openapi's deserializers (the same Go types).
Run after `cargo fetch`:  python3 hack/gen-proto-schema.py
"""
import glob, json, os, re, sys

registry = os.path.expanduser("~/.cargo/registry/src")
def crate_dir(name):
    hits = sorted(glob.glob(f"{registry}/*/{name}"))
    if not hits:
        sys.exit(f"{name} is not in {registry}: run cargo fetch first")
    return hits[-1]

pb = crate_dir("k8s-pb-0.9.0") + "/src"
oa = crate_dir("k8s-openapi-0.29.0") + "/src/v1_33"

# JSON names per (module, struct) from k8s-openapi: "podIP" => Field::Key_pod_ip
json_names, global_names = {}, {}
for path in glob.glob(f"{oa}/**/*.rs", recursive=True):
    text = open(path).read()
    module = os.path.relpath(os.path.dirname(path), oa).replace(os.sep, ".")
    impls = [m for m in re.finditer(r"impl<'de> crate::serde::Deserialize<'de> for (\w+)", text)
             if m.group(1) != "Field"]
    for i, m in enumerate(impls):
        end = impls[i + 1].start() if i + 1 < len(impls) else len(text)
        body = text[m.end():end]
        names = dict((snake, js) for js, snake in re.findall(r'"([^"]+)" => Field::Key_(\w+)', body))
        json_names[(module, m.group(1))] = names
        for snake, js in names.items():
            global_names.setdefault(snake, js)

def camel(snake):
    snake = snake.removeprefix("r#")
    parts = snake.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])

attr_re = re.compile(r'#\[prost\(([^)]*)\)\]\s*pub ([\w#]+):\s*(.+?),\n(?=\s*(?:///|#\[|\}|$))', re.S)
messages, raw = {}, {}
for path in glob.glob(f"{pb}/**/mod.rs", recursive=True):
    module = os.path.relpath(os.path.dirname(path), pb).replace(os.sep, ".")
    text = open(path).read()
    for sm in re.finditer(r"pub struct (\w+) \{(\}|.*?\n\})", text, re.S):
        struct, body = sm.group(1), sm.group(2)
        fields = []
        for am in attr_re.finditer(body + "\n"):
            attr, name, rtype = am.group(1), am.group(2), am.group(3)
            tag = int(re.search(r'tag = "(\d+)"', attr).group(1))
            kind = attr.split(",")[0].strip().split(" ")[0]
            rtype = " ".join(rtype.split())
            label = "repeated" if "repeated" in attr else "optional"
            ref = None
            if kind.endswith("map"):
                k, v = re.search(r'map = "(\w+), (\w+)', attr).groups()
                kind = f"map:{k}:{v}"
                if v == "message":
                    inner = re.search(r"Map<[^,]+,\s*(.+)>$", rtype).group(1)
                    ref = inner
            elif kind == "message":
                ref = re.sub(r"^(::core::option::Option|::prost::alloc::vec::Vec|::prost::alloc::boxed::Box)<", "", rtype)
                ref = ref.rstrip(">")
                ref = re.sub(r"^::prost::alloc::boxed::Box<", "", ref)
            if ref is not None:
                ref = re.sub(r"\s+", "", ref).rstrip(",")
                parts = module.split(".")
                segs = ref.split("::")
                while segs and segs[0] == "super":
                    parts = parts[:-1]
                    segs = segs[1:]
                ref = ".".join(parts + segs)
            fields.append([tag, name.removeprefix("r#"), kind, label, ref])
        raw[f"{module}.{struct}"] = (module, struct, fields)

def norm(n):
    return n.replace("_", "").lower()

for full, (module, struct, fields) in raw.items():
    known = json_names.get((module, struct))
    if known is None:
        # prost renames acronyms (HostIP -> HostIp): match the struct without case.
        known = next((v for (m, st), v in json_names.items() if m == module and st.lower() == struct.lower()), None)
    known_norm = {norm(k): v for k, v in (known or {}).items()}
    out = []
    for tag, bare, kind, label, ref in fields:
        js = known_norm.get(norm(bare))
        if js is None and known is not None and kind == "message" and ref in raw:
            inner = [norm(f[1]) for f in raw[ref][2]]
            # A Go struct embedded with `json:",inline"`: its fields belong to the parent. Most
            # (not all) must be known: the parent's k8s-openapi version may lag a field
            # (EphemeralContainerCommon's newest).
            if inner and sum(n in known_norm for n in inner) * 5 >= len(inner) * 4:
                js = ""
        if js is None:
            js = global_names.get(bare) or camel(bare)
        out.append([tag, js, kind, label, ref])
    messages[full] = out

out = os.path.join(os.path.dirname(__file__), "..", "apiserver", "src", "serving", "proto", "schema.json")
with open(out, "w") as f:
    json.dump(messages, f, separators=(",", ":"), sort_keys=True)
print(f"{len(messages)} messages -> {os.path.normpath(out)}")
