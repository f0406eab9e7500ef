"""Run configs: YAML + `--set a.b=c` overrides -> a typed, validated `RunSpec`.

Every field is declared once below with its type, default, range and help text (`fedvlp.spec`).
Anything else (an unknown key, a wrong type, a value out of range, an unknown method, dataset,
partitioner or server rule, a plugin that does not import) is a `ConfigError` whose one-line message
names the dotted key, raised before any Ray or MLflow work starts. YAML is read with
`yaml.safe_load`; nothing in a config is evaluated as code.

Configs and search spaces ship inside the package (`fedvlp/configs`, `fedvlp/tune_spaces`), so an
installed wheel runs as a checkout does: `fedvlp run fedmpt_scenes` names a shipped config, and any
path to a YAML file of your own works too.
"""
from __future__ import annotations

import dataclasses
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from fedvlp.errors import ConfigError
from fedvlp.spec import build_dataclass, flatten, spec_field, type_name

PACKAGE_DIR = Path(__file__).resolve().parent
CONFIGS_DIR = PACKAGE_DIR / "configs"
SPACES_DIR = PACKAGE_DIR / "tune_spaces"
DEFAULT_CONFIG = CONFIGS_DIR / "quickstart.yaml"
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


@dataclass(frozen=True)
class DataSpec:
    name: str = spec_field("synthetic-scenes", "dataset, by registered name (fedvlp list datasets)")
    root: str | None = spec_field(None, "dataset root on disk, in its published layout (real datasets only)")
    options: dict[str, Any] = spec_field({}, "the dataset reader's own options, e.g. food101 {top_k: 8}, mmimdb "
                                             "{protocol: fedprime} (fedvlp list datasets shows them)")
    num_train: int = spec_field(2000, "synthetic training samples", ge=1)
    num_val: int = spec_field(500, "synthetic validation samples, drawn like the clients' union: what tuning and "
                                   "sweeps select on", ge=1)
    num_test: int = spec_field(1000, "synthetic test samples, drawn like the clients' union (scenes also draws as "
                                     "many in its decorrelated shift split)", ge=1)
    num_holdout: int = spec_field(500, "synthetic held-out pool, drawn like train and split over the clients "
                                       "by the partition rule: their local test sets (0: no personal metrics)", ge=0)
    local_val_fraction: float = spec_field(
        0.5, "the share of each client's part of the held-out pool kept as its local val set (personal_val_*, what a "
             "personalised method is tuned on); the rest is its local test set (personal_*)", ge=0, lt=1)
    val_fraction: float = spec_field(0.1, "real datasets without an official validation split: the fraction of "
                                          "the training data split off as val, by the seed", gt=0, lt=1)
    holdout_fraction: float = spec_field(0.1, "real datasets: the fraction of the training data split off as the "
                                              "held-out pool of the clients' local test sets", ge=0, lt=1)
    label_mask: float = spec_field(
        0.0, "multi-label: each training annotation is hidden with this probability", ge=0, lt=1)
    mask_as: Literal["unknown", "negative"] = spec_field(
        "unknown", "a hidden label is unknown (-1, ignored by the loss) or dropped to negative")
    missing_rate: float = spec_field(
        0.0, "image+text: fraction eta of training samples that lose a modality", ge=0, le=1)
    missing_type: Literal["text", "image", "both"] = spec_field(
        "both", "which modality they lose; 'both': half lose the image, half the text")
    missing_client_skew: float = spec_field(
        0.0, "0: clients differ only by their samples; up to 1: clients differ in which modality they miss", ge=0, le=1)
    feature_cache: bool = spec_field(True, "cache frozen image features on disk under the cache dir")


@dataclass(frozen=True)
class VirtualClockSpec:
    """Simulated device speeds (FedScale's virtual clock): stragglers without waiting on wall-clock time."""
    enabled: bool = spec_field(
        False, "give each client a simulated completion time; round_deadline_s is then simulated")
    seconds_per_sample: float = spec_field(
        0.02, "compute seconds of the median device per training sample and epoch", gt=0)
    uplink_mbps: float = spec_field(10.0, "upload bandwidth of the median device, megabits per second", gt=0)
    speed_spread: float = spec_field(
        0.5, "sigma of the log-normal spread of device compute speed and bandwidth across clients (0: all equal)", ge=0)


@dataclass(frozen=True)
class FederationSpec:
    clients: int = spec_field(10, "number of virtual clients N", ge=1)
    pooled_from: int | None = spec_field(
        None, "a centralised arm (clients: 1): its one client holds the pooled data of this many clients, partitioned "
        "and given their missing patterns exactly as the federated run with that many clients", ge=2)
    participation: float = spec_field(
        1.0, "fraction rho of clients sampled per round, max(1, round(rho*N))", gt=0, le=1)
    partition: str = spec_field(
        "auto", "client split, by registered name (fedvlp list partitioners): auto = heterogeneity for "
        "multi-label data, dirichlet for single-label")
    partition_options: dict[str, Any] = spec_field({}, "a plugin partitioner's own options")
    heterogeneity: float = spec_field(
        0.5, "label skew t: 0 = IID, 1 = one co-occurrence pattern per client", ge=0, le=1)
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
class ServerSpec:
    rules: dict[str, str] = spec_field(
        {}, "parameter-name prefix -> server rule (fedvlp list rules), overriding the method's own rule for that "
            "prefix, e.g. {'': fedadam}; the longest prefix wins")
    options: dict[str, dict] = spec_field({}, "server rule -> its options, e.g. {fedadam: {lr: 0.01}}")


@dataclass(frozen=True)
class PrivacySpec:
    """Client-level differential privacy (DP-FedAvg) and simulated secure aggregation
    (fedvlp.platform.aggregation.privacy, fedvlp.platform.aggregation.secagg): they apply to every parameter group
    a method averages; parameters kept on the clients are untouched."""
    noise_multiplier: float | None = spec_field(
        None, "DP-FedAvg: Gaussian noise sigma * clip_norm on the sum of the clipped client updates (null: no DP "
              "unless target_epsilon is set)", ge=0)
    target_epsilon: float | None = spec_field(
        None, "compute noise_multiplier for this epsilon over the run's rounds and participation instead", gt=0)
    clip_norm: float = spec_field(1.0, "DP-FedAvg: each client's update (its change of the global state) is "
                                       "clipped to this L2 norm", gt=0)
    delta: float = spec_field(1e-5, "DP: the delta of (epsilon, delta)-DP", gt=0, lt=1)
    secure_aggregation: bool = spec_field(
        False, "clients mask their updates pairwise (Bonawitz et al.); the coordinator only sees the sum")

    @property
    def differential(self) -> bool:
        return self.noise_multiplier is not None or self.target_epsilon is not None


@dataclass(frozen=True)
class ResourcesSpec:
    workers: int = spec_field(2, "ClientWorker actors P; virtual clients are spread over them", ge=1)
    num_cpus: float = spec_field(0.75, "CPUs reserved per worker", gt=0)
    num_gpus: float = spec_field(0.0, "GPUs reserved per worker; fractional (e.g. 0.25) packs workers on a GPU", ge=0)
    coordinator_cpus: float = spec_field(0.5, "CPUs reserved for the coordinator actor", gt=0)
    round_timeout_s: float = spec_field(
        600.0, "a client update still out after this is dropped as hung and its worker replaced", gt=0)
    startup_timeout_s: float = spec_field(
        600.0, "workers that have not loaded backbone and data by then fail loudly", gt=0)
    placement_timeout_s: float = spec_field(60.0, "fail if the run's actors cannot be placed within this", gt=0)
    keep_warm_s: float = spec_field(
        300.0, "on a running cluster (RAY_ADDRESS): a finished run's actors stay placed this long for the next run of "
        "the same shape, which then starts without starting a process; 0 = stop them with the run", ge=0)
    cohort_placement: Literal["balanced", "home"] = spec_field(
        "balanced", "where a round's clients train: balanced (clients move from the busiest worker to the idlest "
        "while that shortens the round) or home (client k on worker k mod P, its data never read elsewhere)")
    client_dispatch: Literal["per_worker", "per_client"] = spec_field(
        "per_worker", "how a round's updates are sent to the workers: per_worker (one task trains a worker's whole "
        "share, one client after another) or per_client (a task per client); the same updates either way, and "
        "per_client under a wall-clock round_deadline_s, where each client's arrival time counts")
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
    plugins: tuple[str, ...] = spec_field(
        (), "modules to import first in every process (they register methods, rules, datasets, partitioners)")
    backbone: BackboneSpec = field(default_factory=BackboneSpec)
    data: DataSpec = field(default_factory=DataSpec)
    federation: FederationSpec = field(default_factory=FederationSpec)
    server: ServerSpec = field(default_factory=ServerSpec)
    privacy: PrivacySpec = field(default_factory=PrivacySpec)
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    tracking: TrackingSpec = field(default_factory=TrackingSpec)
    output_dir: str = spec_field("fedvlp-runs", "where round checkpoints are written")

    def to_dict(self) -> dict:
        out = _plain(dataclasses.asdict(self))
        out["method"] = {"name": self.method.name, **_plain(dataclasses.asdict(self.method.params))}
        return out

    def flat(self) -> dict[str, Any]:
        """The config as dotted keys, as logged to MLflow params."""
        return flatten(self.to_dict())


def _plain(value):
    """Tuples as lists, so the dict dumps as plain YAML and reads back as the same config."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def describe_keys(spec: RunSpec) -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, value in `spec`, help) of every config key, the method's own included."""
    def walk(obj, prefix: str):
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, MethodSpec):
                yield "method.name", "str", value.name, "the algorithm (fedvlp list methods)"
                yield from walk(value.params, "method.")
            elif dataclasses.is_dataclass(value) and dataclasses.is_dataclass(hints[f.name]):
                yield from walk(value, f"{prefix}{f.name}.")
            else:
                help_text = f.metadata.get("help", "")
                if "tune" in f.metadata:
                    help_text += f" [tuned: {f.metadata['tune'].describe()}]"
                shown = dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) \
                    else value
                yield f"{prefix}{f.name}", type_name(hints[f.name]), shown, help_text
    return list(walk(spec, ""))


# ---------------------------------------------------------------- files and overrides

def resolve_file(text: str | Path, directory: Path, kind: str) -> Path:
    """A YAML path, or the name of a file shipped in `directory` (`fedmpt_scenes` for configs/fedmpt_scenes.yaml)."""
    path = Path(text).expanduser()
    if path.is_file():
        return path
    named = directory / f"{text}.yaml"
    if not path.suffix and named.is_file():
        return named
    shipped = ", ".join(sorted(p.stem for p in directory.glob("*.yaml")))
    raise ConfigError(f"{text}: {kind} file not found; expected a YAML file or a shipped {kind} name ({shipped})")


def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=c' -> ('a.b', c); the value is read as YAML (so 0.5, true, null and [1, 2] work)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text}: expected KEY=VALUE with a dotted key, e.g. federation.rounds=3")
    try:
        return key.strip(), yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        return key.strip(), value


def set_dotted(raw: dict, key: str, value) -> list[str]:
    """raw['a']['b'] = value for key 'a.b'. Switching `method.name` drops the old method's parameters:
    returns the dotted keys dropped that way."""
    dropped = []
    if key == "method.name" and isinstance(raw.get("method"), dict) and raw["method"].get("name") != value:
        dropped = [f"method.{k}" for k in raw["method"] if k != "name"]
        raw["method"] = {}
    node = raw
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {part} is not a section")
    node[leaf] = value
    return dropped


def apply_overrides(raw: dict, overrides: list[str], warnings: list[str] | None = None) -> dict:
    """Apply `--set` overrides in the order given. A method switch drops the settings of the method switched from
    (the config's and earlier overrides'), which belong to that method: one line on stderr names them (or is
    appended to `warnings`, for a caller that prints it once the config is valid)."""
    given: list[str] = []
    for text in overrides:
        key, value = parse_override(text)
        old = raw.get("method", {}).get("name") if isinstance(raw.get("method"), dict) else None
        lost = set_dotted(raw, key, value)
        if lost:
            earlier = [k for k in lost if k in given]
            fix = f"{', '.join(earlier)} came from an earlier --set: give --set method.name first" if earlier \
                else "--set a setting after method.name to keep it"
            line = f"fedvlp: warning: --set {key}={value} drops {old}'s settings {', '.join(lost)} ({value}'s " \
                   f"defaults apply); {fix}"
            if warnings is None:
                print(line, file=sys.stderr)
            else:
                warnings.append(line)
        given.append(key)
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


def read_config(path: str | Path) -> dict:
    """A run config file's mapping with its `base:` resolved: the base config (a path relative to this file, or a
    shipped config name; it may have a base of its own) with this file's sections merged over it, key by key.
    A `method:` that names another method replaces the base's method section: its settings belong to the
    base's method."""
    chain: list[Path] = []

    def resolved(path: Path) -> dict:
        chain.append(path.resolve())
        raw = read_yaml(path)
        if "base" not in raw:
            return raw
        base = raw.pop("base")
        target = resolve_base(base, path)
        if target.resolve() in chain:
            cycle = " -> ".join(p.name for p in [*chain, target.resolve()])
            raise ConfigError(f"{path}: base: {base} makes a cycle ({cycle}); expected a chain of bases that ends")
        under = resolved(target)
        if isinstance(raw.get("method"), dict) and "name" in raw["method"]:
            set_dotted(under, "method.name", raw["method"]["name"])  # another method: the base's settings go
        return merged(under, raw)

    return resolved(Path(path))


def resolve_base(base, naming_file: Path) -> Path:
    """The config a `base:` names: a path relative to the file that names it, or a shipped config name."""
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{naming_file}: base: expected a run config file or a shipped config name, got {base!r}")
    relative = naming_file.parent / Path(base).expanduser()
    if relative.is_file():
        return relative
    shipped = CONFIGS_DIR / f"{base}.yaml"
    if not Path(base).suffix and shipped.is_file():
        return shipped
    raise ConfigError(f"{naming_file}: base: {base} not found; expected a run config file relative to "
                      f"{naming_file.parent} or a shipped config name (fedvlp list configs)")


def merged(base: dict, over: dict) -> dict:
    """`over` merged into `base`: mappings key by key, anything else (lists included) replaced."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if both else value
    return out


# ---------------------------------------------------------------- building and checking

def build_spec(raw: dict) -> RunSpec:
    """The validated RunSpec of a raw config mapping: plugins first, then every section, then the checks
    that need the registries (method, dataset, partitioner, server rules, backbone family)."""
    from fedvlp.plugins import env_plugins, load_plugins

    raw = dict(raw)
    if "base" in raw:  # read_config resolves it: this mapping was read without
        raise ConfigError(f"base: {raw['base']!r} is not resolved here; expected a mapping read by read_config, "
                          f"which merges the base's sections in")
    plugins = raw.get("plugins") or []
    if not isinstance(plugins, (list, tuple)):
        raise ConfigError(f"plugins: expected a list of module names, got {plugins!r}")
    plugins = list(dict.fromkeys([*env_plugins(), *plugins]))  # $FEDVLP_PLUGINS first, as they load first
    load_plugins(plugins)
    raw["plugins"] = plugins
    from fedvlp.methods.registry import METHODS, declaration  # a built-in's module (torch) is not imported

    method_raw = raw.pop("method", None)
    if not isinstance(method_raw, dict) or "name" not in method_raw:
        raise ConfigError(f"method.name: expected one of {', '.join(METHODS.names())}")
    method_raw = dict(method_raw)
    name = method_raw.pop("name")
    cls = declaration(name)
    method = MethodSpec(name, build_dataclass(cls.Params, method_raw, "method."))
    spec = build_dataclass(RunSpec, raw, "", given={"method": method})
    spec = dataclasses.replace(spec, data=_checked_data(spec.data),
                               federation=_checked_federation(spec.federation), server=_checked_server(spec.server))
    _check_backbone(spec, cls.backbone_kind)
    _check_privacy(spec, cls)
    _check_centralised(spec)
    return spec


def _check_centralised(spec: RunSpec) -> None:
    """One client stands for "all the data in one place" only if its data is a federated partition pooled:
    a draw of its own (one Beta share of missing images for the whole set) would be another dataset."""
    fed, data = spec.federation, spec.data
    if fed.pooled_from is not None and fed.clients != 1:
        raise ConfigError(f"federation.pooled_from: pools a federated partition into one client; expected "
                          f"federation.clients: 1, got {fed.clients}")
    if fed.clients == 1 and fed.pooled_from is None and data.missing_client_skew > 0 and data.missing_rate > 0:
        raise ConfigError(f"data.missing_client_skew: {data.missing_client_skew} makes clients differ in their "
                          f"missing pattern, but federation.clients is 1; expected federation.pooled_from (the "
                          f"federated run's client count, whose data the one client pools) or missing_client_skew: 0")


def _check_privacy(spec: RunSpec, method_cls) -> None:
    """DP and secure aggregation need every global parameter group to be averaged by the coordinator."""
    from fedvlp.platform.aggregation import LOCAL, RULES

    privacy = spec.privacy
    if privacy.noise_multiplier is not None and privacy.target_epsilon is not None:
        raise ConfigError("privacy.target_epsilon: give either privacy.noise_multiplier or privacy.target_epsilon")
    if not (privacy.differential or privacy.secure_aggregation):
        return
    what = "privacy.noise_multiplier" if privacy.differential else "privacy.secure_aggregation"
    rules = {**method_cls.server_rules, **spec.server.rules}
    weightings = set()
    for prefix, name in rules.items():
        if name == LOCAL:
            continue
        rule = RULES.get(name)
        if rule.kind != "average":
            raise ConfigError(f"{what}: {spec.method.name}'s parameters {prefix or '(all)'!r} use the server rule "
                              f"{name}, which sees individual client states and cannot be made private; expected "
                              f"average rules only (fedvlp list rules)")
        weightings.add(rule.weighting)
    if privacy.secure_aggregation and not privacy.differential and len(weightings) > 1:
        raise ConfigError("privacy.secure_aggregation: the method's parameter groups are averaged with different "
                          "weights (samples and uniform); expected one weighting for the masked sum")


def _checked_data(data: DataSpec) -> DataSpec:
    from fedvlp.data.catalogue import datasets

    reader = datasets().get(data.name)
    if reader.needs_root:
        if not data.root:
            raise ConfigError(f"data.root: required for {data.name} (the directory of its published layout)")
        if not Path(data.root).expanduser().is_dir():
            raise ConfigError(f"data.root: {data.root} is not a directory; expected the {data.name} dataset root")
    return dataclasses.replace(data, options=_options(reader.options, data.options, "data.options."))


def _checked_federation(federation: FederationSpec) -> FederationSpec:
    from fedvlp.data.partition import PARTITIONERS

    if federation.partition == "auto":
        if federation.partition_options:
            raise ConfigError("federation.partition_options: auto picks a built-in partitioner, which takes none")
        return federation
    partitioner = PARTITIONERS.get(federation.partition)
    return dataclasses.replace(federation, partition_options=_options(
        partitioner.options, federation.partition_options, "federation.partition_options."))


def _checked_server(server: ServerSpec) -> ServerSpec:
    from fedvlp.platform.aggregation import LOCAL, RULES

    for name in server.rules.values():
        if name != LOCAL:
            RULES.get(name)
    for rule_name, raw in server.options.items():
        rule = RULES.get(rule_name)
        if rule.options is None:
            raise ConfigError(f"server.options.{rule_name}: the rule {rule_name} takes no options")
        _options(rule.options, raw, f"server.options.{rule_name}.")  # validated here; merged with the method's later
    return server


def _options(cls, raw, prefix: str):
    """A registry entry's options: its dataclass built from `raw`, or `raw` itself when it declares none."""
    if dataclasses.is_dataclass(raw):
        return raw
    if cls is None:
        if raw:
            raise ConfigError(f"{prefix.rstrip('.')}: takes no options, got {raw!r}")
        return {}
    return build_dataclass(cls, raw, prefix)


def _check_backbone(spec: RunSpec, kind: str) -> None:
    from fedvlp.backbones.loaders import backbone_family

    family = backbone_family(spec.backbone.name)
    if family != kind:
        examples = {"clip": "tiny-clip or ViT-B-16", "vilt": "tiny-vilt or dandelin/vilt-b32-mlm"}[kind]
        names = {"clip": "CLIP", "vilt": "ViLT"}
        raise ConfigError(f"backbone.name: {spec.method.name} needs a {names[kind]} backbone ({examples}); "
                          f"{spec.backbone.name!r} is a {names[family]} one")


def load_spec(path: str | Path | None = None, overrides: list[str] | None = None) -> RunSpec:
    """The RunSpec of a config (a path or a shipped name; default the quickstart) with `--set` overrides."""
    raw = read_config(resolve_file(path, CONFIGS_DIR, "config") if path else DEFAULT_CONFIG)
    warnings: list[str] = []
    spec = build_spec(apply_overrides(raw, list(overrides or []), warnings))
    for line in warnings:  # once the config is valid: a switch to an unknown method is its error alone
        print(line, file=sys.stderr)
    return spec
