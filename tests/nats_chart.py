"""Checks of deploy/kubernetes/nats-values.yaml against the official NATS chart, without helm.

Why: the values are not rendered here (no helm, no cluster), so a key the chart does not have
(silently ignored by helm) or a value it writes into `nats.conf` in a form nats-server refuses
would only show when the NATS pods crash-loop. `max_payload: 8MB` is one: the chart writes it as
the JSON string "8MB" and nats-server stops at "interface {} is string, not int64" (the chart's
`<< 8MB >>` form writes it raw).

With the chart's own defaults and config templates vendored in tests/vendor/nats_chart (see its
SOURCE.md):
- `values_problems`: every key of the values is one the chart's defaults have (below a default
  that is an empty map, e.g. `merge`, `env`, `topologySpreadConstraints`, any key), with a value
  of the default's type;
- `pod_fragment`: the pieces merged into the chart's StatefulSet (`container.merge`,
  `podTemplate.merge.spec`) as a Pod, to validate against the Kubernetes schemas;
- `render_config`: the `nats.conf` the chart writes from the values, re-implemented after
  files/config/{config,cluster,tls,jetstream}.yaml and `nats.formatConfig` for the options those
  files read; values that turn on anything else are reported as not rendered, never guessed.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent / "vendor" / "nats_chart"
RELEASE = "nats"  # `helm install nats nats/nats`: the chart names everything after it


def defaults() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def values_problems(values: Mapping[str, Any], base: Mapping[str, Any] | None = None, path: str = "") -> list[str]:
    base = defaults() if base is None else base
    problems: list[str] = []
    for key, value in values.items():
        where = f"{path}{key}"
        if key not in base:
            near = ", ".join(sorted(map(str, base))) or "(none)"
            problems.append(f"{where}: the chart has no such value (its keys here: {near})")
            continue
        default = base[key]
        if isinstance(default, Mapping):
            if not isinstance(value, Mapping):
                problems.append(f"{where}: the chart expects a map here")
            elif default:  # an empty default map takes any keys (merge, env, labels, ...)
                problems += values_problems(value, default, f"{where}.")
        elif isinstance(default, list) and not isinstance(value, list):
            problems.append(f"{where}: the chart expects a list here")
        elif isinstance(default, bool) and not isinstance(value, bool):
            problems.append(f"{where}: the chart expects true or false here, not {value!r}")
        elif isinstance(default, int) and not isinstance(default, bool) and (
                isinstance(value, bool) or not isinstance(value, int)):
            problems.append(f"{where}: the chart expects a number here, not {value!r}")
    return problems


def _merged(values: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The chart's defaults overwritten by `values` (helm's coalescing of maps)."""
    out = copy.deepcopy(dict(defaults() if base is None else base))
    for key, value in values.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(value, out[key])
        else:
            out[key] = copy.deepcopy(value)
    return out


def pod_fragment(values: Mapping[str, Any]) -> dict[str, Any]:
    """A Pod holding what the values merge into the chart's nats container and pod spec."""
    v = _merged(values)
    container = {"name": "nats", "image": "nats", **v["container"]["merge"]}
    spec = {**v["podTemplate"]["merge"].get("spec", {}), "containers": [container]}
    spread = v["podTemplate"]["topologySpreadConstraints"]
    if spread:  # the chart makes each `key: {...}` a constraint on that topology key
        spec["topologySpreadConstraints"] = [{"topologyKey": k, **c, "labelSelector": {"matchLabels": {"app": "nats"}}}
                                             for k, c in spread.items()]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nats-0"}, "spec": spec}


def _with_merge(doc: dict[str, Any], section: Mapping[str, Any], where: str, unsupported: list[str]) -> dict[str, Any]:
    if section.get("patch"):
        unsupported.append(f"{where}.patch (a JSON patch)")
    return _merged(section.get("merge") or {}, doc)


def _tls(tls: Mapping[str, Any], ca: Mapping[str, Any], where: str, unsupported: list[str]) -> dict[str, Any]:
    """files/config/tls.yaml"""
    doc: dict[str, Any] = {}
    if tls.get("secretName"):
        d = str(tls["dir"]).rstrip("/")
        doc["cert_file"] = f"{d}/{tls.get('cert') or 'tls.crt'}"
        doc["key_file"] = f"{d}/{tls.get('key') or 'tls.key'}"
    if ca.get("enabled") and (ca.get("configMapName") or ca.get("secretName")):
        doc["ca_file"] = f"{str(ca['dir']).rstrip('/')}/{ca.get('key') or 'ca.crt'}"
    return _with_merge(doc, tls, where, unsupported)


def _cluster(c: Mapping[str, Any], v: Mapping[str, Any], unsupported: list[str]) -> dict[str, Any]:
    """files/config/cluster.yaml"""
    urls = c["routeURLs"]
    if urls.get("user") or urls.get("useFQDN"):
        unsupported.append("config.cluster.routeURLs (user, useFQDN)")
    proto = "tls" if c["tls"]["enabled"] else "nats"
    name = v["statefulSet"].get("name") or RELEASE
    headless = v["headlessService"].get("name") or f"{RELEASE}-headless"
    doc: dict[str, Any] = {
        "name": name, "port": c["port"], "no_advertise": c["noAdvertise"],
        "routes": [f"{proto}://{name}-{i}.{headless}:{c['port']}" for i in range(int(c["replicas"]))]}
    if c["tls"]["enabled"]:
        doc["tls"] = _tls(c["tls"], v["tlsCA"], "config.cluster.tls", unsupported)
    return _with_merge(doc, c, "config.cluster", unsupported)


def _jetstream(js: Mapping[str, Any], unsupported: list[str]) -> dict[str, Any]:
    """files/config/jetstream.yaml"""
    doc: dict[str, Any] = {}
    memory, files = js["memoryStore"], js["fileStore"]
    doc["max_memory_store"] = f"<< {memory['maxSize']} >>" if memory["enabled"] and memory.get("maxSize") else 0
    if files["enabled"]:
        doc["store_dir"] = files["dir"]
        size = files.get("maxSize") or (files["pvc"]["size"] if files["pvc"]["enabled"] else None)
        if size:
            doc["max_file_store"] = f"<< {size} >>"
    else:
        doc["max_file_store"] = 0
    return _with_merge(doc, js, "config.jetstream", unsupported)


def render_config(values: Mapping[str, Any]) -> tuple[str, list[str]]:
    """(the nats.conf the chart writes, what it could not render)."""
    v = _merged(values)
    config, unsupported = v["config"], []
    doc: dict[str, Any] = {"server_name": "<< $SERVER_NAME >>", "lame_duck_grace_period": "10s",
                           "lame_duck_duration": "30s", "pid_file": "/var/run/nats/nats.pid",
                           "port": config["nats"]["port"]}
    for section in ("leafnodes", "websocket", "mqtt", "gateway", "resolver", "profiling"):
        if config[section].get("enabled"):
            unsupported.append(f"config.{section}")
    if config["nats"]["tls"]["enabled"]:
        doc["tls"] = _tls(config["nats"]["tls"], v["tlsCA"], "config.nats.tls", unsupported)
    if config["cluster"]["enabled"]:
        doc["cluster"] = _cluster(config["cluster"], v, unsupported)
    if config["monitor"]["enabled"]:
        doc["https_port" if config["monitor"]["tls"]["enabled"] else "http_port"] = config["monitor"]["port"]
    if config["jetstream"]["enabled"]:
        doc["jetstream"] = _jetstream(config["jetstream"], unsupported)
    doc = _with_merge(doc, config, "config", unsupported)
    return format_config(doc), unsupported


def format_config(doc: Mapping[str, Any]) -> str:
    """templates/_helpers.tpl `nats.formatConfig`: pretty JSON with sorted keys, `"<< x >>"` written
    raw, a `...$include` key as an include directive."""
    text = json.dumps(doc, indent=2, sort_keys=True)
    text = re.sub(r'".*\$include": "(.*)",?', r"include \1;", text)
    return re.sub(r'"<<\s+(.*?)\s+>>"', r"\1", text) + "\n"
