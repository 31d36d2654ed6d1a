"""Kubernetes credentials, loaded one way for every reader and actuator: in-cluster config (a pod's service
account) first, else the kubeconfig."""

from __future__ import annotations

from typing import Any

from vigil.model import VigilInputError


def kube_api_client() -> Any:
    """A ``kubernetes.client.ApiClient`` from in-cluster config, else the kubeconfig; one line if neither works."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError, TypeError, ValueError) as err:
            raise VigilInputError(
                f"no Kubernetes credentials: not in a cluster and no usable kubeconfig ({err})"
            ) from None
    return client.ApiClient()
