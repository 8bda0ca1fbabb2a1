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
{{- printf "http://%s:%d%s" (include "gpumgr.extenderHost" .) (int .Values.extender.port) .Values.extender.urlPrefix -}}
{{- end -}}
{{- end -}}

{{/* The KubeSchedulerConfiguration extenders stanza (a YAML list item). */}}
{{- define "gpumgr.extenderStanza" -}}
- urlPrefix: {{ include "gpumgr.extenderURL" . | quote }}
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  weight: {{ int .Values.scheduler.weight }}
  enableHTTPS: {{ hasPrefix "https://" (include "gpumgr.extenderURL" .) }}
  httpTimeout: {{ .Values.scheduler.httpTimeout }}
  nodeCacheCapable: true
  ignorable: {{ .Values.scheduler.ignorable }}
  managedResources:
    - name: tencent.com/vcuda-core
      ignoredByScheduler: false
    - name: tencent.com/vcuda-memory
      ignoredByScheduler: false
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
{{- end -}}
