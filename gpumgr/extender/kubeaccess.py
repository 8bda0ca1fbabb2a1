"""List and watch through the `kubernetes` client, and the client's configuration for the bind calls.

The client is blocking: list and watch run in the watchers' own threads. Bodies are read as raw JSON
(`_preload_content=False`): the extender works on API JSON, as the scheduler sends it, and skips the client's
model classes. The bind calls (`podcalls.PodCalls`) use aiohttp with this client's configuration. Every failure
comes out as `ApiCallError` with the HTTP status (0: no answer).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpumgr.kube.pace import MAX_PAGE_BYTES, MAX_PAGE_ELEMENTS, ListTooLarge, read_capped
from gpumgr.serving import jsonbound

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
CALL_TIMEOUT = 10.0  # read timeout of one get, patch, bind or list page
POOL_SIZE = 6  # HTTP connections of the kubernetes client (three watches, their re-lists)
MERGE_PATCH = "application/merge-patch+json"
CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"


class ApiCallError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def api_client(source: Any) -> Any:
    """A `kubernetes.client.ApiClient`: `source` is one already made, a kubeconfig path, or empty for the
    in-cluster service account."""
    from kubernetes import client, config

    if isinstance(source, client.ApiClient):
        return source
    cfg = client.Configuration()
    if source:
        config.load_kube_config(config_file=str(Path(source)), client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = POOL_SIZE
    return client.ApiClient(cfg)


class KubeAccess:
    def __init__(self, client_source: Any):
        from kubernetes import client

        self._owned = not isinstance(client_source, client.ApiClient)
        self.api_client = api_client(client_source)
        self.core = client.CoreV1Api(self.api_client)

    @property
    def configuration(self) -> Any:
        return self.api_client.configuration

    def close(self) -> None:
        if self._owned:
            self.api_client.close()

    # -- blocking, for the watcher threads ------------------------------------------------------------------
    def list_page(self, resource: str, limit: int, cont: str | None) -> dict[str, Any]:
        """One page of a list, read within MAX_PAGE_BYTES and MAX_PAGE_ELEMENTS (gpumgr.kube.pace): a server that
        ignores `limit` and sends everything at once is cut off (ApiCallError naming the bound), not read whole."""
        kwargs: dict[str, Any] = {"limit": limit}
        if cont:
            kwargs["_continue"] = cont
        resp = self._call(self._lister(resource), _request_timeout=(CONNECT_TIMEOUT, 60.0),
                          _preload_content=False, **kwargs)
        return _json(_read_capped(resp, f"the list of {resource} (limit {limit})"), f"the list of {resource}")

    def open_watch(self, resource: str, resource_version: str, timeout_seconds: int) -> Any:
        """A streaming response of watch events (one JSON object per line)."""
        return self._call(self._lister(resource), watch=True, resource_version=resource_version,
                          allow_watch_bookmarks=True, timeout_seconds=timeout_seconds, _preload_content=False,
                          _request_timeout=(CONNECT_TIMEOUT, timeout_seconds + 30.0))

    def _lister(self, resource: str) -> Callable[..., Any]:
        if resource == "nodes":
            return self.core.list_node  # type: ignore[no-any-return]
        if resource == "pods":
            return self.core.list_pod_for_all_namespaces  # type: ignore[no-any-return]
        if resource == "resourceclaims":
            from kubernetes import client

            api = getattr(client, "ResourceV1Api", None)  # kubernetes >= 34; older clients: the plain path
            if api is not None:
                return api(self.api_client).list_resource_claim_for_all_namespaces  # type: ignore[no-any-return]
            return self._list_claims_by_path
        raise ValueError(f"no list for {resource!r}")

    def _list_claims_by_path(self, **kwargs: Any) -> Any:
        """A client without ResourceV1Api (kubernetes 30..33): the same call through the client's generic API, whose
        shape depends on the generator it was made with (`param_serialize` + `call_api`, or the older `call_api`
        taking the query); the raw response either way (the callers read JSON or a stream from it)."""
        query = [(k.lstrip("_").replace("resource_version", "resourceVersion")
                  .replace("allow_watch_bookmarks", "allowWatchBookmarks")
                  .replace("timeout_seconds", "timeoutSeconds"), v)
                 for k, v in kwargs.items() if not k.startswith("_") or k == "_continue"]
        headers = {"Accept": "application/json"}
        timeout = kwargs.get("_request_timeout")
        api = self.api_client
        if hasattr(api, "param_serialize"):
            from kubernetes.client.exceptions import ApiException

            request = api.param_serialize(method="GET", resource_path=CLAIMS_PATH, query_params=query,
                                          header_params=headers, auth_settings=["BearerToken"])
            resp = api.call_api(*request, _request_timeout=timeout)
            if not 200 <= resp.status <= 299:
                resp.read()
                raise ApiException.from_response(http_resp=resp, body=None, data=None)
            return resp.response
        return api.call_api(
            CLAIMS_PATH, "GET", query_params=query, header_params=headers, auth_settings=["BearerToken"],
            response_type=None, _return_http_data_only=True, _preload_content=kwargs.get("_preload_content", False),
            _request_timeout=timeout)

    @staticmethod
    def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kwargs)
        except ApiException as e:
            raise ApiCallError(int(e.status or 0), _message(e)) from None
        except Exception as e:  # noqa: BLE001 - urllib3 / socket errors: the API did not answer
            raise ApiCallError(0, f"{type(e).__name__}: {e}") from None


def _read_capped(resp: Any, what: str) -> bytes:
    """The body within MAX_PAGE_BYTES (gpumgr.kube.pace.read_capped), failures as ApiCallError."""
    try:
        return read_capped(resp, MAX_PAGE_BYTES, what)
    except ListTooLarge as e:
        raise ApiCallError(0, str(e)) from None
    except Exception as e:  # noqa: BLE001 - urllib3 / socket errors mid-body
        raise ApiCallError(0, f"{what}: the answer broke off: {type(e).__name__}: {e}") from None


def _json(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = jsonbound.loads(raw, max_elements=MAX_PAGE_ELEMENTS, max_depth=jsonbound.API_OBJECT_DEPTH, what=what)
    except ValueError as e:
        raise ApiCallError(0, f"the API answered with something gpumgr will not decode: {e}") from None
    if not isinstance(doc, dict):
        raise ApiCallError(0, "the API answered with JSON that is not an object")
    return doc


def _message(e: Any) -> str:
    """The `message` of the API's Status body, or the HTTP reason."""
    try:
        body = json.loads(e.body or "{}")
        if isinstance(body, dict) and body.get("message"):
            return f"{e.status} {body.get('reason') or e.reason}: {body['message']}"
    except (ValueError, TypeError):
        pass
    return f"{e.status} {e.reason}"
