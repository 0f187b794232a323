"""Operator settings from the environment and from `python -m sluice.operator` flags."""

from __future__ import annotations

import pytest

from sluice.operator.settings import Settings


def test_defaults_without_environment():
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.clusterwide and not settings.leader_election
    assert settings.default_image == "sluice-runtime:latest"


def test_environment_sets_every_field():
    settings = Settings.from_env(
        {
            "SLUICE_DEFAULT_IMAGE": "ghcr.io/x/runtime:1",
            "SLUICE_NAMESPACES": "ml, serving",
            "SLUICE_LOG_FORMAT": "json",
            "SLUICE_VERBOSE": "true",
            "SLUICE_CLUSTER_DOMAIN": "corp.local",
            "SLUICE_POD_MONITORS": "never",
            "SLUICE_LEADER_ELECTION": "true",
            "SLUICE_LEASE_NAME": "sluice-leader",
            "SLUICE_LEASE_NAMESPACE": "sluice-system",
            "SLUICE_IDENTITY": "sluice-operator-abc",
            "SLUICE_LEASE_DURATION_SECONDS": "20",
            "SLUICE_RENEW_DEADLINE_SECONDS": "12",
            "SLUICE_RETRY_PERIOD_SECONDS": "3",
            "SLUICE_LIVENESS_ENDPOINT": "http://0.0.0.0:8080/healthz",
            "SLUICE_RETRY_DELAY_SECONDS": "2.5",
            "SLUICE_RETRY_MAX_DELAY_SECONDS": "60",
            "SLUICE_RESYNC_SECONDS": "120",
            "SLUICE_WORKERS": "8",
            "SLUICE_API_TIMEOUT_SECONDS": "5",
            "SLUICE_RUN_AS_USER": "none",
            "SLUICE_ROLL_ON_UPGRADE": "true",
            "SLUICE_SCHEDULING_GRACE_SECONDS": "0",
        }
    )
    assert settings == Settings(
        default_image="ghcr.io/x/runtime:1",
        namespaces=("ml", "serving"),
        log_format="json",
        verbose=True,
        cluster_domain="corp.local",
        pod_monitors="never",
        leader_election=True,
        lease_name="sluice-leader",
        lease_namespace="sluice-system",
        identity="sluice-operator-abc",
        lease_duration_seconds=20.0,
        renew_deadline_seconds=12.0,
        retry_period_seconds=3.0,
        liveness_endpoint="http://0.0.0.0:8080/healthz",
        retry_delay_seconds=2.5,
        retry_max_delay_seconds=60.0,
        resync_seconds=120.0,
        workers=8,
        api_timeout_seconds=5.0,
        run_as_user=None,
        roll_on_upgrade=True,
        scheduling_grace_seconds=0.0,
    )
    assert not settings.clusterwide and settings.leader_election


def test_the_scheduling_grace_defaults_to_ten_minutes_and_has_a_flag():
    assert Settings.from_env({}).scheduling_grace_seconds == 600.0
    flagged = Settings.from_env({"SLUICE_SCHEDULING_GRACE_SECONDS": "60"}).with_flags(
        ["--scheduling-grace-seconds", "90"]
    )
    assert flagged.scheduling_grace_seconds == 90.0


def test_run_as_user_is_a_uid_or_left_to_the_platform():
    assert Settings.from_env({"SLUICE_RUN_AS_USER": "1001"}).run_as_user == 1001
    assert Settings.from_env({}).run_as_user == 1000
    assert Settings().with_flags(["--run-as-user", "none"]).run_as_user is None


def test_flags_override_the_environment():
    settings = Settings.from_env(
        {"SLUICE_DEFAULT_IMAGE": "a:1", "SLUICE_NAMESPACES": "x"}
    ).with_flags(["--default-image", "b:2", "-n", "ml", "-n", "serving", "--log-format", "full"])
    assert (settings.default_image, settings.namespaces, settings.log_format) == (
        "b:2",
        ("ml", "serving"),
        "full",
    )


@pytest.mark.parametrize(
    "env",
    [
        {"SLUICE_LOG_FORMAT": "xml"},
        {"SLUICE_POD_MONITORS": "always"},
        {"SLUICE_RETRY_DELAY_SECONDS": "0"},
        {"SLUICE_RESYNC_SECONDS": "0"},
        {"SLUICE_WORKERS": "0"},
        {"SLUICE_RETRY_DELAY_SECONDS": "5", "SLUICE_RETRY_MAX_DELAY_SECONDS": "1"},
        {"SLUICE_RUN_AS_USER": "0"},
        {"SLUICE_SCHEDULING_GRACE_SECONDS": "-1"},
        {"SLUICE_DEFAULT_IMAGE": "has space"},
    ],
)
def test_invalid_settings_are_refused_at_startup(env):
    with pytest.raises(ValueError):
        Settings.from_env(env)


def test_leader_election_needs_a_namespace_and_ordered_periods():
    with pytest.raises(ValueError, match="SLUICE_LEASE_NAMESPACE"):
        Settings(leader_election=True)
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        Settings(leader_election=True, lease_namespace="ops", renew_deadline_seconds=20.0)
    flagged = Settings().with_flags(["--leader-election", "--lease-namespace", "ops"])
    assert flagged.leader_election and flagged.lease_namespace == "ops"
