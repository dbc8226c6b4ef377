{{/* Names and labels shared by every template. */}}

{{- define "burstsched.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's router objects: <release>-burstsched, or the release name when it already says burstsched. */}}
{{- define "burstsched.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "burstsched.simName" -}}
{{- printf "%s-sim" (include "burstsched.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "burstsched.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "burstsched.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "burstsched.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "burstsched.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The router's pods (the simulated replicas carry component: sim, so no router selector takes them). */}}
{{- define "burstsched.selectorLabels" -}}
app.kubernetes.io/name: {{ include "burstsched.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end }}

{{- define "burstsched.simSelectorLabels" -}}
app.kubernetes.io/name: {{ include "burstsched.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: sim
{{- end }}

{{- define "burstsched.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The replicas the router dispatches to, as burstsched's `endpoints` list (JSON, for fromJsonArray):
the simulated StatefulSet's pods when sim.enabled, else the vLLM StatefulSet's pods by their stable DNS names
(http://<statefulSet>-<i>.<service>.<namespace>.svc:<port>), then any listed under `endpoints`.
*/}}
{{- define "burstsched.endpoints" -}}
{{- $endpoints := list }}
{{- if .Values.sim.enabled }}
{{- $name := include "burstsched.simName" . }}
{{- range $i := until (int .Values.sim.replicas) }}
{{- $host := printf "%s-%d.%s.%s.svc" $name $i $name $.Release.Namespace }}
{{- $endpoints = append $endpoints (dict "name" (printf "sim-%d" $i) "url" (printf "http://%s:8000" $host)) }}
{{- end }}
{{- else if .Values.vllm.statefulSet }}
{{- $namespace := default .Release.Namespace .Values.vllm.namespace }}
{{- range $i := until (int .Values.vllm.replicas) }}
{{- $host := printf "%s-%d.%s.%s.svc" $.Values.vllm.statefulSet $i $.Values.vllm.service $namespace }}
{{- $url := printf "http://%s:%d" $host (int $.Values.vllm.port) }}
{{- $endpoints = append $endpoints (dict "name" (printf "%s-%d" $.Values.vllm.statefulSet $i) "url" $url) }}
{{- end }}
{{- end }}
{{- concat $endpoints .Values.endpoints | toJson }}
{{- end }}

{{/* The router's config file: `config` from the values with the endpoints above. */}}
{{- define "burstsched.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $_ := set $config "endpoints" (include "burstsched.endpoints" . | fromJsonArray) }}
{{- toYaml $config }}
{{- end }}

{{/* The port /metrics is served on: config.auth.admin_port when set (then only there), else the API port. */}}
{{- define "burstsched.metricsPortName" -}}
{{- $auth := default (dict) .Values.config.auth }}
{{- if $auth.admin_port }}admin{{ else }}http{{ end }}
{{- end }}
