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

{{/* The headless Service that gives each highly available job manager a stable DNS name. */}}
{{- define "weir.jobmanagerHeadless" -}}
{{- printf "%s-jobmanager-headless" (include "weir.fullname" .) -}}
{{- end -}}

{{/* The control-plane addresses of every job manager of a highly available release, comma-separated. */}}
{{- define "weir.jobmanagerPods" -}}
{{- $addrs := list -}}
{{- range $i := until (int .Values.jobmanager.replicas) -}}
{{- $addrs = append $addrs (printf "%s-jobmanager-%d.%s.%s.svc:%v" (include "weir.fullname" $) $i (include "weir.jobmanagerHeadless" $) $.Release.Namespace $.Values.jobmanager.rpcPort) -}}
{{- end -}}
{{- join "," $addrs -}}
{{- end -}}

{{/*
Refuses the combinations of values the schema cannot: several job managers without high
availability, high availability without etcd endpoints or checkpoint storage, file:// storage
without a shared volume.
*/}}
{{- define "weir.validate" -}}
{{- $ha := .Values.highAvailability -}}
{{- $cs := .Values.checkpointStorage -}}
{{- if and (gt (int .Values.jobmanager.replicas) 1) (not $ha.enabled) -}}
{{- fail "jobmanager.replicas above 1 needs highAvailability.enabled: without it one job manager owns the jobs on its volume" -}}
{{- end -}}
{{- if $ha.enabled -}}
{{- if not $ha.etcd.endpoints -}}
{{- fail "highAvailability.enabled needs highAvailability.etcd.endpoints (the chart does not run etcd)" -}}
{{- end -}}
{{- if not $cs.url -}}
{{- fail "highAvailability.enabled needs checkpointStorage.url (s3://... or file:// on a ReadWriteMany volume): every job manager must reach the checkpoints" -}}
{{- end -}}
{{- if and $ha.etcd.auth.username (not $ha.etcd.auth.passwordSecret) -}}
{{- fail "highAvailability.etcd.auth.username needs highAvailability.etcd.auth.passwordSecret" -}}
{{- end -}}
{{- if and $ha.etcd.auth.passwordSecret (not $ha.etcd.auth.username) -}}
{{- fail "highAvailability.etcd.auth.passwordSecret needs highAvailability.etcd.auth.username" -}}
{{- end -}}
{{- end -}}
{{- if and (hasPrefix "file://" $cs.url) (not $cs.existingClaim) -}}
{{- fail "checkpointStorage.url file://... needs checkpointStorage.existingClaim, a ReadWriteMany volume every job manager and task manager mounts" -}}
{{- end -}}
{{- if and $cs.existingClaim (not (hasPrefix "file://" $cs.url)) -}}
{{- fail "checkpointStorage.existingClaim is only for a file:// checkpointStorage.url" -}}
{{- end -}}
{{- end -}}

{{/* The checkpoint storage's environment (AWS credentials from a Secret) of a Weir container. */}}
{{- define "weir.storageEnv" -}}
{{- with .Values.checkpointStorage.credentialsSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: AWS_SECRET_ACCESS_KEY
- name: AWS_REGION
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: AWS_REGION
      optional: true
{{- end }}
{{- end -}}

{{/* The path a file:// checkpoint storage's shared volume is mounted at: the URL's path. */}}
{{- define "weir.storageMountPath" -}}
{{- (urlParse .Values.checkpointStorage.url).path -}}
{{- end -}}

{{/* The volume mount of a file:// checkpoint storage (nothing for s3://). */}}
{{- define "weir.storageMount" -}}
{{- if .Values.checkpointStorage.existingClaim }}
- name: checkpoints
  mountPath: {{ include "weir.storageMountPath" . }}
{{- end }}
{{- end -}}

{{- define "weir.storageVolume" -}}
{{- with .Values.checkpointStorage.existingClaim }}
- name: checkpoints
  persistentVolumeClaim:
    claimName: {{ . }}
{{- end }}
{{- end -}}
