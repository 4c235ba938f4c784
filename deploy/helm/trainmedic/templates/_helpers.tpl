{{/* Names, labels and the pieces the controller and the node agent share. */}}

{{- define "trainmedic.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trainmedic.fullname" -}}
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

{{/* The metrics Service: a DNS label, so at most 63 characters with its suffix. */}}
{{- define "trainmedic.metricsService" -}}
{{- include "trainmedic.fullname" . | trunc 55 | trimSuffix "-" }}-metrics
{{- end }}

{{- define "trainmedic.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trainmedic.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainmedic.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "trainmedic.labels" -}}
helm.sh/chart: {{ include "trainmedic.chart" . }}
{{ include "trainmedic.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: trainmedic
{{- end }}

{{- define "trainmedic.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainmedic.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "trainmedic.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "trainmedic.policyConfigMap" -}}
{{- default (printf "%s-policy" (include "trainmedic.fullname" .)) .Values.existingPolicyConfigMap }}
{{- end }}

{{/* Where things are mounted: the env vars below point at these paths. */}}
{{- define "trainmedic.stateDir" -}}/var/lib/trainmedic{{- end }}
{{- define "trainmedic.signalSpool" -}}/var/lib/trainmedic/spool/signals{{- end }}
{{- define "trainmedic.keysDir" -}}/run/trainmedic/keys{{- end }}
{{/* A directory the key copier creates 0700 inside the in-memory volume (an emptyDir
itself is world-writable, which munged calls insecure). */}}
{{- define "trainmedic.keys" -}}/run/trainmedic/keys/private{{- end }}

{{/* The shared signal spool volume (a shared hostPath or an RWX claim). */}}
{{- define "trainmedic.signalSpoolVolume" -}}
- name: signal-spool
{{- if .Values.spool.signals.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.spool.signals.existingClaim }}
{{- else }}
  hostPath:
    path: {{ .Values.spool.signals.hostPath }}
    type: Directory
{{- end }}
{{- end }}

{{/*
The init container that copies private keys from their Secret volumes into an
in-memory directory as 0400 files owned by the pod's user. Why: with fsGroup set, the
kubelet makes a Secret volume's files group-readable (0440, root:fsGroup), and both
the controller (spool key) and munged (munge key) refuse a key that others may read.
Call with (dict "root" $ "copies" (list (list SRC DEST) ...)).
*/}}
{{- define "trainmedic.installKeys" -}}
{{- $root := .root -}}
- name: install-keys
  image: {{ include "trainmedic.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  command:
    - sh
    - -ec
    - |
      umask 077
      mkdir -p -m 0700 {{ include "trainmedic.keys" $root }}
      {{- range .copies }}
      install -m 0400 {{ index . 0 }} {{ index . 1 }}
      {{- end }}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
  resources:
    requests:
      cpu: 10m
      memory: 16Mi
    limits:
      memory: 64Mi
  volumeMounts:
    - name: keys
      mountPath: {{ include "trainmedic.keysDir" $root }}
    {{- range .mounts }}
    - name: {{ .name }}
      mountPath: {{ .path }}
      readOnly: true
    {{- end }}
{{- end }}
