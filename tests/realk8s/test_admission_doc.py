"""The AdmissionConfiguration the real-Kubernetes tier runs is read from docs/installation.md
(cluster.documented_admission_config): a doc that no longer shows it fails with a message naming what is missing,
not an IndexError; and the doc's user, `<service>.<namespace>.svc`, is the name the API server looks up for the
webhook the chart installs (its Service on port 443; the tier itself calls the webhook by URL, as user '*')."""

from __future__ import annotations

import pytest

from tests.chart.support import NAMESPACE, RELEASE, render
from tests.realk8s.cluster import ADMISSION_HEADING, INSTALLATION_DOC, documented_admission_config, parse_admission_doc

ADMISSION = """```yaml
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: MutatingAdmissionWebhook
  configuration: {kubeConfigFile: /k}
```
"""
KUBECONFIG = """```yaml
apiVersion: v1
kind: Config
users:
- name: '*'
  user: {client-certificate: /c, client-key: /k}
```
"""
NO_USER = KUBECONFIG.replace("users:", "users: []\nx:")


def test_the_documented_user_is_the_service_name_of_the_chart_s_webhook():
    _, kubeconfig = documented_admission_config()
    (user,) = kubeconfig["users"]
    assert "gpumgr" in user["name"] and "gpu-system" in user["name"]  # the doc's release and namespace
    (hook_config,) = [o for o in render({"webhook": {"enabled": True}}).objects
                      if o["kind"] == "MutatingWebhookConfiguration"]
    (service,) = {str(h["clientConfig"]["service"]["name"]) for h in hook_config["webhooks"]}
    (port,) = {h["clientConfig"]["service"].get("port", 443) for h in hook_config["webhooks"]}
    assert (RELEASE, NAMESPACE, port) == ("gpumgr", "gpu-system", 443)  # no ":<port>" in the name the API server seeks
    assert user["name"] == f"{service}.{NAMESPACE}.svc"
    assert set(user["user"]) == {"client-certificate", "client-key"}


@pytest.mark.parametrize(("text", "why"), [
    ("# Install\n", "no section"),
    (f"{ADMISSION_HEADING}\n{ADMISSION}", "shows 1 YAML blocks"),
    (f"{ADMISSION_HEADING}\n{ADMISSION}\n## Next chapter\n{KUBECONFIG}", "shows 1 YAML blocks"),
    (f"{ADMISSION_HEADING}\n{KUBECONFIG}{ADMISSION}", "no longer shows the AdmissionConfiguration"),
    (f"{ADMISSION_HEADING}\n```yaml\n[unclosed\n```\n{KUBECONFIG}", "YAML block 1 .* does not parse"),
    (f"{ADMISSION_HEADING}\n{ADMISSION}{NO_USER}", "exactly one user"),
])
def test_a_doc_that_no_longer_shows_the_configuration_is_named_with_the_reason(text: str, why: str):
    with pytest.raises(ValueError, match=f"installation.md: .*{why}"):  # before: IndexError or ValueError
        parse_admission_doc(text, "docs/installation.md")
    assert parse_admission_doc(f"{ADMISSION_HEADING}\n{ADMISSION}{KUBECONFIG}", str(INSTALLATION_DOC))
