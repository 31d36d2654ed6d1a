"""One typed settings object, read from flags, environment (VIGIL_*) and an optional YAML file."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from vigil.model import VigilInputError, describe_validation_error

# the schedulers remedy actions can go through; none = the outbox and the local GPU only
RemedyBackend = Literal["none", "kubernetes", "slurm"]


class Settings(BaseSettings):
    """Defaults work on a laptop: everything lives under ./.vigil."""

    model_config = SettingsConfigDict(env_prefix="VIGIL_", extra="ignore")

    home: Path = Field(default=Path(".vigil"), description="directory for the embedded store and caches")
    db_url: str = Field(default="", description="SQLAlchemy URL; empty means sqlite:///<home>/vigil.db")
    metrics_url: str = Field(default="", description="Prometheus-compatible HTTP API; empty = embedded store")
    api_token: str = Field(default="", description="one shared bearer token for mutating REST / MCP calls "
                           "(identity 'api', admin); per-user tokens: users_file")
    users_file: Path | None = Field(default=None, description="users with roles and hashed tokens; "
                                    "default <home>/users.yaml when it exists")
    identity_header: str = Field(default="", description="header naming the user, set by an authenticating "
                                 "reverse proxy (e.g. X-Forwarded-User); empty = bearer tokens only")
    two_person_rule: bool = Field(default=True, description="the proposer of a destructive action cannot "
                                  "approve it")
    llm_base_url: str = Field(default="", description="OpenAI-compatible endpoint; empty = deterministic")
    llm_model: str = ""
    llm_api_key: str = ""
    llm_timeout_s: float = 30.0
    llm_tokenizer: str = Field(default="", description="the endpoint model's tokenizer (a tokenizer.json, or "
                               "a .gguf with transformers installed) to count `vigil ask`'s working context; "
                               "empty = four characters a token")
    execute_actions: bool = Field(default=False, description="False = every actuator runs in dry-run")
    remedy_backend: RemedyBackend = Field(
        default="none", description="the scheduler that `vigil remedy act / apply / idle-workers` act through when "
        "--backend is not given, so a diagnosis plan's command runs as printed; none = outbox and local GPU only")
    max_cordon_share: float = Field(default=0.1, ge=0.0, le=1.0)
    max_cordon_share_per_switch: float = Field(default=0.5, ge=0.0, le=1.0)
    remedy_lease_s: float = Field(default=30.0, gt=0, description="how long a server's or engine's claim on "
                                  "an action it executes holds unless renewed; another process resumes the action "
                                  "once it lapses (hosts' clocks must agree to well within it: NTP)")
    remedy_lease_renew_s: float = Field(default=10.0, gt=0, description="how often the owner renews its claim "
                                        "while the back end works; shorter than remedy_lease_s")
    remedy_commands_keep_days: float = Field(default=30.0, gt=0, description="how long the record of a back-end "
                                             "command a run started (table remedy_commands) is kept once settled "
                                             "(ended, gone, killed, adopted, unknown, abandoned); older ones are "
                                             "pruned by the server's or engine's remediator at start and hourly; one "
                                             "a crashed owner left open, its run over, is marked abandoned 7 days "
                                             "past it")
    serve_diagnosis_threads: int = Field(default=1, ge=0, le=8, description="threads of `vigil serve` that "
                                         "diagnose incidents stored without a diagnosis in the background, as "
                                         "soon as they are stored (and, at start, those still lacking one); 0 = "
                                         "off: such an incident waits for *Diagnose again*")
    serve_diagnosis_lease_s: float = Field(default=60.0, gt=0, description="how long a server's claim on an "
                                           "incident it diagnoses holds unless renewed (renewed every third of "
                                           "it while the diagnosis runs); past it another server takes it over")
    serve_diagnosis_retries: int = Field(default=3, ge=0, le=10, description="how many times `vigil serve` "
                                         "tries a failed diagnosis again by itself (an incident still without "
                                         "one), each try later than the one before; then it waits for "
                                         "*Diagnose again*")
    serve_diagnosis_retry_s: float = Field(default=30.0, gt=0, description="how long after a diagnosis failed "
                                           "it is tried again, doubled after each further failure (30, 60, 120 s)")
    store_migration_lock_wait_s: float = Field(default=600.0, gt=0, description="how long a process opening a "
                                               "PostgreSQL store waits for another's schema upgrade (the migration "
                                               "lock) before it stops, naming the holder's pid")
    push_key_window_s: float = Field(default=3600.0, gt=0, description="how long the store keeps the key of a "
                                     "metric push a sender may send again (an agent's samples push, a launch "
                                     "report's step telemetry), however soon the engine prunes the push: a retry "
                                     "within it is stored once, one after it once more")
    engine_interval_s: float = Field(default=5.0, gt=0, description="how often the live engine ticks")
    engine_step_max_s: float = Field(default=300.0, gt=0, description="the longest the engine's loop takes "
                                     "between two marks of progress (one incident's diagnosis with the LLM's "
                                     "retries, one resumed action's back-end command, one span of ids of a moved store "
                                     "renumbered); a loop showing none for engine_interval_s plus this is taken for "
                                     "hung: its lease is no longer renewed, so a standby engine takes over")
    engine_read_ahead_pushes: int = Field(default=0, ge=0, description="how many metric pushes committed past a "
                                          "transaction still running on the PostgreSQL server the engine judges at "
                                          "once and remembers (in memory) before further ones wait for it; 0 = "
                                          "by the load: 40 a node pushing (10 minutes at the agent's 15 s), at "
                                          "least 5,000")
    live_push_max_age_s: float = Field(default=300.0, gt=0, description="a metric push whose newest sample is older "
                                       "than this when the engine reads it (an agent's backlog sent after an "
                                       "outage) is stored but never judged live: the engine keeps the pushes of "
                                       "the last 300 s for its restarts; hosts' clocks must agree to well within it")
    resolve_after_s: float = Field(default=900.0, gt=0, description="quiet time before an incident resolves")
    policies_file: str = Field(default="", description="remediation policies YAML; empty = the built-in ones")
    alertmanager_url: str = Field(default="", description="Alertmanager to push incidents to; empty = off")
    alert_resend_s: float = Field(default=60.0, gt=0, description="re-send open incidents this often")
    alert_webhook_url: str = Field(default="", description="Slack-compatible webhook for incidents; empty = off")
    external_url: str = Field(default="", description="this server's URL as people reach it (alert links)")
    topology_file: str = Field(default="", description="YAML / JSON topology placing nodes in racks and under "
                               "leaf switches; merged with what the agents register")
    kube_jobs_poll_s: float = Field(default=0.0, ge=0, description="read training pods' placement from the "
                                    "Kubernetes API (in cluster) this often; 0 = off")
    slurm_poll_s: float = Field(default=0.0, ge=0, description="read Slurm's jobs (squeue) this often; 0 = off")
    detector_model: str = Field(default="", description="trained learned GPU detector the engine runs beside "
                                "the rules (`vigil detect train --out DIR`); empty = <home>/models/tce-gpu if trained")
    server_url: str = Field(default="", description="Vigil server that `vigil launch` reports to; empty = off")
    server_token: str = Field(default="", description="bearer token for server_url; empty = api_token")
    report_interval_s: float = Field(default=5.0, gt=0, description="how often `vigil launch` sends step "
                                     "telemetry to server_url")

    @field_validator("home")
    @classmethod
    def _home_is_a_directory(cls, home: Path) -> Path:
        if home.exists() and not home.is_dir():
            raise ValueError(f"home {home} is a file; expected a directory")
        return home

    @field_validator("remedy_lease_renew_s")
    @classmethod
    def _renewed_within_the_lease(cls, renew_s: float, info: ValidationInfo) -> float:
        lease_s = info.data.get("remedy_lease_s")
        if lease_s is not None and renew_s >= lease_s:
            raise ValueError(f"{renew_s:g} s: expected less than remedy_lease_s ({lease_s:g} s), or a live owner's "
                             "claim lapses before it is renewed")
        return renew_s

    def database_url(self) -> str:
        if self.db_url:
            return self.db_url
        return f"sqlite:///{self.home / 'vigil.db'}"


def read_yaml(path: Path, what: str) -> Any:
    """Parse a YAML file; a missing or malformed file is one line naming ``what`` and the path."""
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise VigilInputError(f"{what} {path} does not exist") from None
    except OSError as err:
        raise VigilInputError(f"{what} {path} cannot be read: {err.strerror or err}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise VigilInputError(f"{what} {path} is not valid YAML: {str(err).splitlines()[0]}") from None


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Settings from a YAML file (if given), then environment, then explicit overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        loaded = read_yaml(path, "config file")
        if loaded is not None and not isinstance(loaded, dict):
            raise VigilInputError(f"config file {path}: expected a mapping of settings at the top level")
        values.update(loaded or {})
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings(**values)
    except ValidationError as err:
        where = f"config file {path}" if path else "settings"
        raise VigilInputError(f"{where}: {describe_validation_error(err)}") from None


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process's settings: the YAML file named by VIGIL_CONFIG (if set), then VIGIL_* variables."""
    path = os.environ.get("VIGIL_CONFIG")
    return load_settings(Path(path) if path else None)
