{{/* Names and labels shared by every template. */}}

{{- define "epp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-burstsched-epp, or the release name when it already says burstsched-epp. */}}
{{- define "epp.fullname" -}}
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

{{/* The InferencePool's name. */}}
{{- define "epp.poolName" -}}
{{- default (include "epp.fullname" .) .Values.inferencePool.name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "epp.simName" -}}
{{- printf "%s-sim" (include "epp.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "epp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "epp.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "epp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "epp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The picker's pods. */}}
{{- define "epp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "epp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end }}

{{- define "epp.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
