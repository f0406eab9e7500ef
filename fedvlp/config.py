"""Run configs: YAML + `--set a.b=c` overrides -> a typed, validated `RunSpec`.

Every field is declared once below with its type, default, range and help text. Anything
else (an unknown key, a wrong type, a value out of range) is a `ConfigError` whose one-line
message names the dotted key, raised before any Ray or MLflow work starts. YAML is read with
`yaml.safe_load`; nothing in a config is evaluated as code.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from fedvlp.errors import ConfigError

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = CONFIGS_DIR / "quickstart.yaml"


def spec_field(default, help: str, *, ge=None, gt=None, le=None, lt=None):
    """A config field with its help text and an optional numeric range."""
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt}
    return field(default=default, metadata={"help": help, **{k: v for k, v in bounds.items() if v is not None}})


CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")


def _is_local_path(text: str) -> bool:
    """A value meant as a file or directory on this machine, not a model name, tag or hub id."""
    return text.startswith(("/", "./", "../", "~")) or text.endswith(CHECKPOINT_SUFFIXES)


@dataclass(frozen=True)
class BackboneSpec:
    name: str = spec_field("tiny-clip", "open_clip model name: tiny-clip (fedvlp's own) or e.g. ViT-B-16")
    pretrained: str = spec_field(
        "fedvlp", "weights: 'fedvlp' (tiny-clip pretrained and cached by fedvlp), an open_clip tag "
        "such as 'openai', a checkpoint path, or 'none' for random init"
    )

    def __post_init__(self):
        # A missing local path would otherwise fail only after the data is read, when the weights load.
        for key, value in (("backbone.name", self.name), ("backbone.pretrained", self.pretrained)):
            if _is_local_path(value) and not Path(value).expanduser().exists():
                raise ConfigError(f"{key}: {value} does not exist; expected an existing checkpoint file or "
                                  f"model directory, or a model name or tag")


SYNTHETIC_DATASETS = ("synthetic-scenes", "synthetic-recipes")
REAL_DATASETS = ("voc2007", "coco2014", "nuswide", "food101", "mmimdb")


@dataclass(frozen=True)
class DataSpec:
    name: Literal["synthetic-scenes", "synthetic-recipes", "voc2007", "coco2014", "nuswide", "food101", "mmimdb"] = \
        spec_field("synthetic-scenes", "dataset")
    root: str | None = spec_field(None, "dataset root on disk, in its published layout (real datasets only)")
    num_train: int = spec_field(2000, "synthetic training samples", ge=1)
    num_test: int = spec_field(1000, "synthetic test samples (scenes: co-occurrence decorrelated)", ge=1)
    top_k: int | None = spec_field(None, "food101: keep the k classes most frequent in train", ge=1)
    protocol: Literal["multilabel", "fedprime"] = spec_field(
        "multilabel", "mmimdb: 23-genre multi-label, or FED-PRIME's single-genre top-8 protocol")
    label_mask: float = spec_field(0.0, "multi-label: each training annotation is hidden with this probability", ge=0, lt=1)
    mask_as: Literal["unknown", "negative"] = spec_field(
        "unknown", "a hidden label is unknown (-1, ignored by the loss) or dropped to negative")
    missing_rate: float = spec_field(0.0, "image+text: fraction eta of training samples that lose a modality", ge=0, le=1)
    missing_type: Literal["text", "image", "both"] = spec_field(
        "both", "which modality they lose; 'both': half lose the image, half the text")
    missing_client_skew: float = spec_field(
        0.0, "0: clients differ only by their samples; up to 1: clients differ in which modality they miss", ge=0, le=1)
    feature_cache: bool = spec_field(True, "cache frozen image features on disk under the cache dir")

    def __post_init__(self):
        if self.name in REAL_DATASETS:
            if not self.root:
                raise ConfigError(f"data.root: required for {self.name} (the directory of its published layout)")
            if not Path(self.root).expanduser().is_dir():
                raise ConfigError(f"data.root: {self.root} is not a directory; expected the {self.name} dataset root")


@dataclass(frozen=True)
class VirtualClockSpec:
    """Simulated device speeds (FedScale's virtual clock): stragglers without waiting on wall-clock time."""
    enabled: bool = spec_field(False, "give each client a simulated completion time; round_deadline_s is then simulated")
    seconds_per_sample: float = spec_field(0.02, "compute seconds of the median device per training sample and epoch", gt=0)
    uplink_mbps: float = spec_field(10.0, "upload bandwidth of the median device, megabits per second", gt=0)
    speed_spread: float = spec_field(
        0.5, "sigma of the log-normal spread of device compute speed and bandwidth across clients (0: all equal)", ge=0)


@dataclass(frozen=True)
class FederationSpec:
    clients: int = spec_field(10, "number of virtual clients N", ge=1)
    participation: float = spec_field(1.0, "fraction rho of clients sampled per round, max(1, round(rho*N))", gt=0, le=1)
    partition: Literal["auto", "heterogeneity", "dirichlet", "iid"] = spec_field(
        "auto", "client split: auto = heterogeneity for multi-label data, dirichlet for single-label")
    heterogeneity: float = spec_field(0.5, "label skew t: 0 = IID, 1 = one co-occurrence pattern per client", ge=0, le=1)
    dirichlet_alpha: float = spec_field(0.5, "single-label skew: per class, client shares ~ Dir(alpha)", gt=0)
    rounds: int = spec_field(5, "federated rounds", ge=1)
    eval_every: int = spec_field(1, "evaluate the global model every this many rounds (and after the last)", ge=1)
    on_client_failure: Literal["drop", "retry"] = spec_field(
        "drop", "a client update that fails (its worker died, it raised, or it hung past resources.round_timeout_s): "
        "drop it from the round, or retry it (a dead worker is replaced either way)")
    client_retries: int = spec_field(1, "on_client_failure=retry: attempts after the first", ge=0)
    min_clients_per_round: int = spec_field(
        1, "a round in which fewer client updates arrive than this fails loudly instead of aggregating", ge=1)
    round_deadline_s: float | None = spec_field(
        None, "updates arriving later than this are left out of the round: wall-clock seconds, "
        "or simulated seconds when virtual_clock.enabled", gt=0)
    virtual_clock: VirtualClockSpec = field(default_factory=VirtualClockSpec)


@dataclass(frozen=True)
class ResourcesSpec:
    workers: int = spec_field(2, "ClientWorker actors P; virtual clients are spread over them", ge=1)
    num_cpus: float = spec_field(0.75, "CPUs reserved per worker", gt=0)
    num_gpus: float = spec_field(0.0, "GPUs reserved per worker; fractional (e.g. 0.25) packs workers on a GPU", ge=0)
    coordinator_cpus: float = spec_field(0.5, "CPUs reserved for the coordinator actor", gt=0)
    round_timeout_s: float = spec_field(
        600.0, "a client update still out after this is dropped as hung and its worker replaced", gt=0)
    startup_timeout_s: float = spec_field(600.0, "workers that have not loaded backbone and data by then fail loudly", gt=0)
    placement_timeout_s: float = spec_field(60.0, "fail if the run's actors cannot be placed within this", gt=0)
    client_state_memory_mb: float = spec_field(
        1024.0, "client-local states the coordinator keeps in memory; the rest spill to disk under output_dir", ge=0)


@dataclass(frozen=True)
class TrackingSpec:
    uri: str | None = spec_field(None, "MLflow tracking URI; default $MLFLOW_TRACKING_URI or sqlite:///./mlflow.db")
    experiment: str = spec_field("fedvlp", "MLflow experiment name")
    run_name: str | None = spec_field(None, "MLflow run name; default <method>-<dataset>")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    params: Any  # the method's own Params dataclass


@dataclass(frozen=True)
class RunSpec:
    method: MethodSpec
    seed: int = spec_field(0, "the one seed every random stream derives from", ge=0)
    backbone: BackboneSpec = field(default_factory=BackboneSpec)
    data: DataSpec = field(default_factory=DataSpec)
    federation: FederationSpec = field(default_factory=FederationSpec)
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    tracking: TrackingSpec = field(default_factory=TrackingSpec)
    output_dir: str = spec_field("fedvlp-runs", "where round checkpoints are written")

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["method"] = {"name": self.method.name, **dataclasses.asdict(self.method.params)}
        return out

    def flat(self) -> dict[str, Any]:
        """The config as dotted keys, as logged to MLflow params."""
        return flatten(self.to_dict())


def describe_keys(spec: RunSpec) -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, value in `spec`, help) of every config key, the method's own included."""
    def walk(obj, prefix: str):
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, MethodSpec):
                yield "method.name", "str", value.name, "the algorithm (fedvlp.methods)"
                yield from walk(value.params, "method.")
            elif dataclasses.is_dataclass(value):
                yield from walk(value, f"{prefix}{f.name}.")
            else:
                yield f"{prefix}{f.name}", _type_name(hints[f.name]), value, f.metadata.get("help", "")
    return list(walk(spec, ""))


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ---------------------------------------------------------------- validation

def _type_name(tp) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(tp)))
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string", type(None): "null"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _coerce(value, tp, key: str):
    origin = typing.get_origin(tp)
    if isinstance(tp, types.UnionType) or origin is typing.Union:
        for option in typing.get_args(tp):
            try:
                return _coerce(value, option, key)
            except ConfigError:
                continue
    elif origin is Literal:
        if value in typing.get_args(tp):
            return value
    elif tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin in (tuple, list):
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        if isinstance(value, (list, tuple)):
            return tuple(_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")


def _check_range(value, meta: dict, key: str) -> None:
    if value is None:
        return
    checks = {"ge": (lambda v, b: v >= b, ">="), "gt": (lambda v, b: v > b, ">"),
              "le": (lambda v, b: v <= b, "<="), "lt": (lambda v, b: v < b, "<")}
    for name, (ok, symbol) in checks.items():
        if name in meta and not ok(value, meta[name]):
            raise ConfigError(f"{key}: expected a value {symbol} {meta[name]}, got {value!r}")


def build_dataclass(cls, raw: Any, prefix: str, given: dict | None = None):
    """Build dataclass `cls` from a mapping, naming the dotted key of the first problem.

    `given` holds fields already built by the caller (the method section, whose schema
    depends on the method's name).
    """
    given = given or {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields or key in given:
            raise ConfigError(f"{prefix}{key}: unknown key (expected one of: {', '.join(fields)})")
    values = dict(given)
    for name, f in fields.items():
        key = f"{prefix}{name}"
        if name not in raw or name in given:
            continue
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            values[name] = build_dataclass(tp, raw[name], f"{key}.")
        else:
            values[name] = _coerce(raw[name], tp, key)
            _check_range(values[name], f.metadata, key)
    return cls(**values)


def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=c' -> ('a.b', c); the value is read as YAML (so 0.5, true, null and [1, 2] work)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text}: expected KEY=VALUE with a dotted key, e.g. federation.rounds=3")
    try:
        return key.strip(), yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        return key.strip(), value


def set_dotted(raw: dict, key: str, value) -> None:
    """raw['a']['b'] = value for key 'a.b'. Switching `method.name` drops the old method's parameters."""
    if key == "method.name" and isinstance(raw.get("method"), dict) and raw["method"].get("name") != value:
        raw["method"] = {}
    node = raw
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {part} is not a section")
    node[leaf] = value


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    for text in overrides:
        set_dotted(raw, *parse_override(text))
    return raw


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found; expected a YAML file such as {DEFAULT_CONFIG}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None)
        raise ConfigError(f"{path}: not valid YAML{where}" + (f" ({problem})" if problem else "")) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections at the top level")
    return raw


def build_spec(raw: dict) -> RunSpec:
    from fedvlp.methods import METHODS  # late import: methods import torch

    raw = dict(raw)
    method_raw = raw.pop("method", None)
    if not isinstance(method_raw, dict) or "name" not in method_raw:
        raise ConfigError(f"method.name: expected one of {', '.join(sorted(METHODS))}")
    method_raw = dict(method_raw)
    name = method_raw.pop("name")
    if name not in METHODS:
        raise ConfigError(f"method.name: unknown method {name!r} (expected one of: {', '.join(sorted(METHODS))})")
    method = MethodSpec(name, build_dataclass(METHODS[name].Params, method_raw, "method."))
    spec = build_dataclass(RunSpec, raw, "", given={"method": method})
    _check_backbone(spec, METHODS[name].backbone_kind)
    return spec


def _check_backbone(spec: RunSpec, kind: str) -> None:
    from fedvlp.backbones import backbone_family

    family = backbone_family(spec.backbone.name)
    if family != kind:
        examples = {"clip": "tiny-clip or ViT-B-16", "vilt": "tiny-vilt or dandelin/vilt-b32-mlm"}[kind]
        names = {"clip": "CLIP", "vilt": "ViLT"}
        raise ConfigError(f"backbone.name: {spec.method.name} needs a {names[kind]} backbone ({examples}); "
                          f"{spec.backbone.name!r} is a {names[family]} one")


def load_spec(path: str | Path | None = None, overrides: list[str] | None = None) -> RunSpec:
    raw = read_yaml(path or DEFAULT_CONFIG)
    return build_spec(apply_overrides(raw, list(overrides or [])))
