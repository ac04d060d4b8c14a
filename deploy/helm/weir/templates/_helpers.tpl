{{/* The release's base name: <release>-weir, or <release> when it already contains "weir". */}}
{{- define "weir.fullname" -}}
{{- if contains "weir" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-weir" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "weir.labels" -}}
app.kubernetes.io/name: weir
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: call with (list . "jobmanager"). */}}
{{- define "weir.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: weir
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "weir.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "weir.tokenSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-token" (include "weir.fullname" .)) -}}
{{- end -}}

{{- define "weir.jobmanagerService" -}}
{{- printf "%s-jobmanager" (include "weir.fullname" .) -}}
{{- end -}}

{{/* Security settings every Weir container runs with. */}}
{{- define "weir.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{- define "weir.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}
