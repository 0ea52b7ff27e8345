{{/* Name of the chart, overridable. */}}
{{- define "rankscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Object-name prefix. Truncated to 40 characters because KubeRay derives longer names
(head service, pods) from the RayCluster name and Kubernetes caps names at 63.
*/}}
{{- define "rankscope.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rankscope.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "rankscope.labels" -}}
helm.sh/chart: {{ include "rankscope.chart" . }}
{{ include "rankscope.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "rankscope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rankscope.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rankscope.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "rankscope.rayClusterName" -}}
{{- include "rankscope.fullname" . }}
{{- end }}

{{- define "rankscope.coordinatorService" -}}
{{- printf "%s-coordinator" (include "rankscope.fullname" .) }}
{{- end }}

{{/* The address node agents dial: the coordinator Service's cluster DNS name. */}}
{{- define "rankscope.coordinatorAddress" -}}
{{- printf "tcp://%s.%s.svc:%d" (include "rankscope.coordinatorService" .) .Release.Namespace (int .Values.coordinator.port) }}
{{- end }}

{{- define "rankscope.curveSecretName" -}}
{{- if .Values.curve.create }}
{{- printf "%s-curve" (include "rankscope.fullname" .) }}
{{- else }}
{{- required "curve.existingSecret is required when curve.create is false" .Values.curve.existingSecret }}
{{- end }}
{{- end }}

{{- define "rankscope.exportsClaim" -}}
{{- default (printf "%s-exports" (include "rankscope.fullname" .)) .Values.exports.persistence.existingClaim }}
{{- end }}

{{/* The endpoint ranks connect to, as seen inside any pod that mounts socketDir. */}}
{{- define "rankscope.agentEndpoint" -}}
{{- printf "ipc://%s/%s" (trimSuffix "/" .Values.agent.socketDir) .Values.agent.socketName }}
{{- end }}

{{- define "rankscope.curveMountPath" -}}/etc/rankscope/curve{{- end }}

{{/* `rankscope coordinator` flags, one YAML list item each. */}}
{{- define "rankscope.coordinatorArgs" -}}
{{- $curveDir := include "rankscope.curveMountPath" . -}}
- --address
- "127.0.0.1:6379"
- --bind
- {{ printf "tcp://0.0.0.0:%d" (int .Values.coordinator.port) | quote }}
- --export-dir
- {{ .Values.exports.mountPath | quote }}
- --job
- {{ .Values.job | quote }}
- --on-divergence
- {{ .Values.coordinator.onDivergence | quote }}
- --curve-secret
- {{ printf "%s/%s" $curveDir .Values.curve.files.coordinatorSecret | quote }}
- --allow-dir
- {{ printf "%s/allowed" $curveDir | quote }}
{{- range .Values.coordinator.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* `rankscope agent` flags, one YAML list item each. */}}
{{- define "rankscope.agentArgs" -}}
{{- $curveDir := include "rankscope.curveMountPath" . -}}
- --coordinator
- {{ include "rankscope.coordinatorAddress" . | quote }}
- --listen
- {{ include "rankscope.agentEndpoint" . | quote }}
- --job
- {{ .Values.job | quote }}
- --spool
- {{ printf "%s/spool" (trimSuffix "/" .Values.agent.stateDir) | quote }}
- --bundle-dir
- {{ printf "%s/bundles" (trimSuffix "/" .Values.agent.stateDir) | quote }}
- --host
- "$(NODE_NAME)"
- --curve-secret
- {{ printf "%s/%s" $curveDir .Values.curve.files.agentSecret | quote }}
- --coordinator-key
- {{ printf "%s/%s" $curveDir .Values.curve.files.coordinatorPublic | quote }}
{{- range .Values.agent.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* Ray head health: the raylet (via the dashboard agent) and the GCS (via the dashboard). */}}
{{- define "rankscope.rayHealthCheck" -}}
import urllib.request as u; [u.urlopen(x, timeout=2).read() for x in ("http://127.0.0.1:52365/api/local_raylet_healthz", "http://127.0.0.1:8265/api/gcs_healthz")]
{{- end }}
