{{/* Chart name, overridable with nameOverride. */}}
{{- define "gpumgr.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Prefix of every object name. Component suffixes ("-extender", "-scheduler") are at most 10
characters, so the prefix is cut to 52 to keep names within 63.
*/}}
{{- define "gpumgr.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpumgr.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "gpumgr.labels" -}}
helm.sh/chart: {{ include "gpumgr.chart" . }}
app.kubernetes.io/name: {{ include "gpumgr.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpumgr
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "agent"). */}}
{{- define "gpumgr.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpumgr.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of one component's objects; same argument as gpumgr.selectorLabels. */}}
{{- define "gpumgr.componentLabels" -}}
{{ include "gpumgr.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Object name of a component: <fullname>-<component>. */}}
{{- define "gpumgr.componentName" -}}
{{- printf "%s-%s" (include "gpumgr.fullname" .ctx) .component -}}
{{- end -}}

{{/* ServiceAccount name of a component; same argument as gpumgr.selectorLabels. */}}
{{- define "gpumgr.serviceAccountName" -}}
{{- $sa := (index .ctx.Values .component).serviceAccount -}}
{{- if $sa.create -}}
{{- default (include "gpumgr.componentName" .) $sa.name -}}
{{- else -}}
{{- default "default" $sa.name -}}
{{- end -}}
{{- end -}}

{{/* The gpumgr image reference. */}}
{{- define "gpumgr.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The kube-scheduler image: an empty tag means the cluster's vMAJOR.MINOR.PATCH. */}}
{{- define "gpumgr.schedulerImage" -}}
{{- $tag := .Values.scheduler.image.tag -}}
{{- if not $tag -}}
{{- $tag = regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- if not $tag -}}
{{- fail (printf "scheduler.image.tag is empty and the cluster version %q has no vMAJOR.MINOR.PATCH prefix; set scheduler.image.tag" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- printf "%s:%s" .Values.scheduler.image.repository $tag -}}
{{- end -}}

{{/* DNS name of the extender Service. */}}
{{- define "gpumgr.extenderHost" -}}
{{- printf "%s.%s.svc" (include "gpumgr.componentName" (dict "ctx" . "component" "extender")) .Release.Namespace -}}
{{- end -}}

{{/* The URL kube-scheduler calls (the stanza's urlPrefix). */}}
{{- define "gpumgr.extenderURL" -}}
{{- if .Values.scheduler.extenderURL -}}
{{- .Values.scheduler.extenderURL -}}
{{- else -}}
{{- $scheme := ternary "http" "https" .Values.extender.insecureServeWithoutAuth -}}
{{- printf "%s://%s:%d%s" $scheme (include "gpumgr.extenderHost" .) (int .Values.extender.port) .Values.extender.urlPrefix -}}
{{- end -}}
{{- end -}}

{{/* The scheduler's API client rate (clientConnection qps and burst; kube-scheduler's own default is 50/100). */}}
{{- define "gpumgr.schedulerClientRate" -}}
{{- $r := .Values.scheduler.clientConnection -}}
qps: {{ $r.qps }}
burst: {{ int $r.burst }}
{{- end -}}

{{/* The KubeSchedulerConfiguration extenders stanza (a YAML list item). */}}
{{- define "gpumgr.extenderStanza" -}}
- urlPrefix: {{ include "gpumgr.extenderURL" . | quote }}
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  weight: {{ int .Values.scheduler.weight }}
  enableHTTPS: {{ hasPrefix "https://" (include "gpumgr.extenderURL" .) }}
  {{- if not .Values.extender.insecureServeWithoutAuth }}
  {{- $dir := ternary "/etc/gpumgr-scheduler/tls" .Values.scheduler.clientCertDir (eq .Values.scheduler.mode "profile") }}
  tlsConfig:
    # The scheduler's client certificate (the extender refuses callers without one) and the CA that
    # signed the extender's serving certificate. serverName: the certificate names the Service.
    certFile: {{ printf "%s/tls.crt" $dir | quote }}
    keyFile: {{ printf "%s/tls.key" $dir | quote }}
    caFile: {{ printf "%s/ca.crt" $dir | quote }}
    serverName: {{ include "gpumgr.extenderHost" . | quote }}
  {{- end }}
  httpTimeout: {{ .Values.scheduler.httpTimeout }}
  nodeCacheCapable: true
  ignorable: {{ .Values.scheduler.ignorable }}
  managedResources:
    - name: tencent.com/vcuda-core
      ignoredByScheduler: false
    - name: tencent.com/vcuda-memory
      ignoredByScheduler: false
    {{- range .Values.agent.mig.extenderProfiles }}
    - name: {{ printf "%s%s" $.Values.agent.mig.resourcePrefix . | quote }}
      ignoredByScheduler: false
    {{- end }}
{{- end -}}

{{/* The webhook needs matchConditions (admissionregistration v1, GA and on by default in Kubernetes 1.28): on
     1.25/1.26 the API server rejects the configuration, and on 1.27 (alpha, off by default) it drops the field,
     so every pod creation would wait on the webhook with failurePolicy Fail. Refuse to render instead. */}}
{{- define "gpumgr.webhookKubeVersion" -}}
{{- if and .Values.webhook.enabled (not (semverCompare ">=1.28.0-0" .Capabilities.KubeVersion.Version)) -}}
{{- fail (printf "webhook.enabled needs Kubernetes >= 1.28 (the webhook only sees GPU pods through matchConditions, GA in 1.28); the cluster is %s: set webhook.enabled=false and give GPU pods schedulerName: %s yourself (see docs/installation.md)" .Capabilities.KubeVersion.Version (include "gpumgr.gpuSchedulerName" .)) -}}
{{- end -}}
{{- end -}}

{{/* Deployment annotations for Stakater Reloader: roll a component that reads its certificate only at start when
     cert-manager renews its Secret (certManager.reloader). Same argument as gpumgr.tlsSecret; empty otherwise. */}}
{{- define "gpumgr.reloaderAnnotations" -}}
{{- $v := .ctx.Values -}}
{{- if and $v.certManager.enabled $v.certManager.reloader (not $v.extender.insecureServeWithoutAuth) -}}
annotations:
  secret.reloader.stakater.com/reload: {{ include "gpumgr.tlsSecret" . | quote }}
{{- end -}}
{{- end -}}

{{/* Cross-field checks the JSON schema cannot express. */}}
{{- define "gpumgr.validate" -}}
{{- $h := .Values.agent.health -}}
{{- if ge (int $h.tempHealthy) (int $h.tempUnhealthy) -}}
{{- fail (printf "agent.health.tempHealthy (%v) must be lower than agent.health.tempUnhealthy (%v)" $h.tempHealthy $h.tempUnhealthy) -}}
{{- end -}}
{{- if and (eq .Values.scheduler.mode "profile") (gt (int .Values.scheduler.replicas) 1) (not .Values.scheduler.leaderElect) -}}
{{- fail "scheduler.replicas > 1 needs scheduler.leaderElect: true (two active schedulers would bind the same pods)" -}}
{{- end -}}
{{- if and (not (kindIs "invalid" .Values.extender.service.nodePort)) (ne .Values.extender.service.type "NodePort") -}}
{{- fail "extender.service.nodePort is set but extender.service.type is not NodePort" -}}
{{- end -}}
{{- if and (not .Values.extender.insecureServeWithoutAuth) (hasPrefix "http://" .Values.scheduler.extenderURL) -}}
{{- fail "scheduler.extenderURL is http:// but the extender serves HTTPS with client certificates; use https:// (or set extender.insecureServeWithoutAuth: true, for tests only)" -}}
{{- end -}}
{{- if and .Values.extender.insecureServeWithoutAuth (hasPrefix "https://" .Values.scheduler.extenderURL) -}}
{{- fail "scheduler.extenderURL is https:// but extender.insecureServeWithoutAuth serves plain HTTP; use http://" -}}
{{- end -}}
{{- if and .Values.extender.networkPolicy.enabled (eq .Values.scheduler.mode "extender-only") (not .Values.extender.networkPolicy.from) -}}
{{- fail "scheduler.mode=extender-only with extender.networkPolicy.enabled needs extender.networkPolicy.from: the peers your own kube-scheduler calls from (e.g. [{ipBlock: {cidr: 10.0.0.10/32}}] for the control-plane node); see docs/installation.md" -}}
{{- end -}}
{{- if and (ne .Values.agent.mode "device-plugin") (not (semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version)) -}}
{{- fail (printf "agent.mode=%s needs Kubernetes >= 1.34 (DRA, resource.k8s.io/v1); the cluster is %s: use agent.mode=device-plugin" .Values.agent.mode .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and (eq .Values.agent.mode "device-plugin") .Values.dra.extendedResource.enabled -}}
{{- fail "dra.extendedResource.enabled needs agent.mode dra or both (the DeviceClass is only rendered with DRA)" -}}
{{- end -}}
{{- end -}}

{{/* schedulerName of GPU pods: the chart's scheduler (profile) or the cluster's default one (extender-only). */}}
{{- define "gpumgr.gpuSchedulerName" -}}
{{- ternary .Values.scheduler.name "default-scheduler" (eq .Values.scheduler.mode "profile") -}}
{{- end -}}

{{/* DNS names of a component's Service. */}}
{{- define "gpumgr.serviceDNSNames" -}}
{{- $svc := include "gpumgr.componentName" . -}}
{{- $ns := .ctx.Release.Namespace -}}
{{- toJson (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) -}}
{{- end -}}

{{/* Names of the Secrets holding TLS material (type kubernetes.io/tls, with ca.crt). */}}
{{- define "gpumgr.tlsSecret" -}}
{{- printf "%s-%s-tls" (include "gpumgr.fullname" .ctx) .component -}}
{{- end -}}

{{/*
Certificates made by Helm (certManager.enabled=false), computed once per render and cached in .Values:
a CA, the extender's serving certificate, the scheduler's client certificate and the webhook's serving
certificate. On upgrade the existing Secrets are reused (lookup) when all of them are present, so the
certificates do not change on every `helm upgrade`; if any is missing all are made anew together.
Returns nothing; read .Values._gpumgrTLS after including it.
*/}}
{{- define "gpumgr.tlsMaterial" -}}
{{- if not (hasKey .Values "_gpumgrTLS") -}}
{{- $ns := .Release.Namespace -}}
{{- $components := include "gpumgr.tlsComponents" . | fromJsonArray -}}
{{- $found := dict -}}
{{- range $components -}}
{{- $s := lookup "v1" "Secret" $ns (include "gpumgr.tlsSecret" (dict "ctx" $ "component" .)) -}}
{{- if and $s $s.data (hasKey $s.data "tls.crt") (hasKey $s.data "tls.key") (hasKey $s.data "ca.crt") -}}
{{- $_ := set $found . (dict "crt" (index $s.data "tls.crt" | b64dec) "key" (index $s.data "tls.key" | b64dec) "ca" (index $s.data "ca.crt" | b64dec)) -}}
{{- end -}}
{{- end -}}
{{- $out := dict -}}
{{- if eq (len $found) (len $components) -}}
{{- $out = $found -}}
{{- else -}}
{{- $days := int .Values.tls.validityDays -}}
{{- /* ECDSA P-256 keys: as strong as RSA 3072 and made in a fraction of the time. */ -}}
{{- $ca := genCAWithKey (printf "%s-ca" (include "gpumgr.fullname" .)) $days (genPrivateKey "ecdsa") -}}
{{- if has "extender" $components -}}
{{- $ext := genSignedCertWithKey (include "gpumgr.extenderHost" .) nil (include "gpumgr.serviceDNSNames" (dict "ctx" . "component" "extender") | fromJsonArray) $days $ca (genPrivateKey "ecdsa") -}}
{{- $_ := set $out "extender" (dict "crt" $ext.Cert "key" $ext.Key "ca" $ca.Cert) -}}
{{- $cli := genSignedCertWithKey (printf "system:%s" (include "gpumgr.componentName" (dict "ctx" . "component" "scheduler"))) nil nil $days $ca (genPrivateKey "ecdsa") -}}
{{- $_ := set $out "scheduler-client" (dict "crt" $cli.Cert "key" $cli.Key "ca" $ca.Cert) -}}
{{- end -}}
{{- if .Values.webhook.enabled -}}
{{- $wh := genSignedCertWithKey (printf "%s.%s.svc" (include "gpumgr.componentName" (dict "ctx" . "component" "webhook")) $ns) nil (include "gpumgr.serviceDNSNames" (dict "ctx" . "component" "webhook") | fromJsonArray) $days $ca (genPrivateKey "ecdsa") -}}
{{- $_ := set $out "webhook" (dict "crt" $wh.Cert "key" $wh.Key "ca" $ca.Cert) -}}
{{- end -}}
{{- end -}}
{{- $_ := set .Values "_gpumgrTLS" $out -}}
{{- end -}}
{{- end -}}

{{/* A checksum of the TLS material a component mounts (pods roll when it changes); "" with cert-manager. */}}
{{- define "gpumgr.tlsChecksum" -}}
{{- if not .ctx.Values.certManager.enabled -}}
{{- include "gpumgr.tlsMaterial" .ctx -}}
{{- index .ctx.Values._gpumgrTLS .component | toJson | sha256sum -}}
{{- end -}}
{{- end -}}

{{/* CEL (admission matchConditions): the pod asks for tencent.com/vcuda-core or vcuda-memory in any container. */}}
{{- define "gpumgr.asksForVGPU" -}}
(object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])).exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, r.startsWith('tencent.com/vcuda-'))) || (has(c.resources.requests) && c.resources.requests.exists(r, r.startsWith('tencent.com/vcuda-')))))
{{- end -}}

{{/* The agent's node restriction in force: node, fields or off (agent.nodeRestriction, auto resolved). */}}
{{- define "gpumgr.nodeRestriction" -}}
{{- $m := .Values.agent.nodeRestriction -}}
{{- $v := .Capabilities.KubeVersion.Version -}}
{{- if eq $m "auto" -}}
{{- if semverCompare ">=1.32.0-0" $v -}}node{{- else if semverCompare ">=1.30.0-0" $v -}}fields{{- else -}}off{{- end -}}
{{- else -}}
{{- if and (eq $m "node") (not (semverCompare ">=1.32.0-0" $v)) -}}
{{- fail (printf "agent.nodeRestriction=node needs Kubernetes >= 1.32 (ServiceAccount tokens carry their node there); the cluster is %s: use fields (1.30+) or off" $v) -}}
{{- end -}}
{{- if and (eq $m "fields") (not (semverCompare ">=1.30.0-0" $v)) -}}
{{- fail (printf "agent.nodeRestriction=fields needs Kubernetes >= 1.30 (ValidatingAdmissionPolicy v1); the cluster is %s: use off" $v) -}}
{{- end -}}
{{- $m -}}
{{- end -}}
{{- end -}}

{{/* Components that get a certificate (JSON list): the extender and the scheduler's client unless the extender
     is insecure, and the webhook when enabled. */}}
{{- define "gpumgr.tlsComponents" -}}
{{- $components := list -}}
{{- if not .Values.extender.insecureServeWithoutAuth -}}{{- $components = list "extender" "scheduler-client" -}}{{- end -}}
{{- if .Values.webhook.enabled -}}{{- $components = append $components "webhook" -}}{{- end -}}
{{- toJson $components -}}
{{- end -}}
