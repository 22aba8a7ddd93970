{{/* Names and labels. */}}
{{- define "llmgw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llmgw.fullname" -}}
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

{{- define "llmgw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmgw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "llmgw.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "llmgw.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "llmgw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "llmgw.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "llmgw.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Secret the pods read: the user's, or the one the chart makes. */}}
{{- define "llmgw.secretName" -}}
{{- default (include "llmgw.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{/*
What the migration hook Job needs before the chart's ordinary objects exist: on a first install,
hooks run first. Its Secret and ServiceAccount are hooks too, of a lower weight, and are kept after
the hooks ran (no hook-succeeded), because the Deployment uses them as well.
*/}}
{{- define "llmgw.preHookAnnotations" -}}
{{- if .Values.migrations.enabled }}
helm.sh/hook: pre-install,pre-upgrade
helm.sh/hook-weight: "-10"
helm.sh/hook-delete-policy: before-hook-creation
{{- end }}
{{- end }}

{{/* Fail at render time on settings the gateway could not start with. */}}
{{- define "llmgw.validate" -}}
{{- if and (not .Values.secrets.existingSecret) (not .Values.secrets.databaseUrl) }}
{{- fail "llmgw needs a PostgreSQL database (the chart never uses the embedded one): set secrets.databaseUrl=postgresql://USER:PASSWORD@HOST:5432/DB, or secrets.existingSecret=NAME of a Secret with the key DATABASE_URL" }}
{{- end }}
{{- if and (eq .Values.rateLimit.backend "redis") (not .Values.secrets.existingSecret) (not .Values.rateLimit.redisUrl) }}
{{- fail "rateLimit.backend=redis needs rateLimit.redisUrl=redis://HOST:6379/0 (or secrets.existingSecret with the key REDIS_URL)" }}
{{- end }}
{{- if and .Values.secrets.existingSecret (or .Values.secrets.databaseUrl .Values.secrets.adminToken .Values.secrets.oidcClientSecret .Values.rateLimit.redisUrl .Values.secrets.providerKeys) }}
{{- fail "with secrets.existingSecret, secret values stay in that Secret: unset secrets.databaseUrl, secrets.adminToken, secrets.oidcClientSecret, rateLimit.redisUrl and secrets.providerKeys (list provider-key names in secrets.providerKeyNames)" }}
{{- end }}
{{- $grace := add (int .Values.shutdown.graceSeconds) (int .Values.shutdown.preStopSeconds) }}
{{- if and .Values.shutdown.terminationGracePeriodSeconds (le (int .Values.shutdown.terminationGracePeriodSeconds) $grace) }}
{{- fail (printf "shutdown.terminationGracePeriodSeconds (%d) must exceed shutdown.graceSeconds + shutdown.preStopSeconds (%d), or streams are killed mid-answer" (int .Values.shutdown.terminationGracePeriodSeconds) $grace) }}
{{- end }}
{{- end }}

{{- define "llmgw.terminationGracePeriodSeconds" -}}
{{- if .Values.shutdown.terminationGracePeriodSeconds }}
{{- .Values.shutdown.terminationGracePeriodSeconds }}
{{- else }}
{{- add (int .Values.shutdown.graceSeconds) (int .Values.shutdown.preStopSeconds) 10 }}
{{- end }}
{{- end }}

{{/* Restricted Pod Security Standard, for the gateway and the migration Job alike. */}}
{{- define "llmgw.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser }}
runAsGroup: {{ .Values.runAsUser }}
fsGroup: {{ .Values.runAsUser }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "llmgw.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser }}
runAsGroup: {{ .Values.runAsUser }}
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "llmgw.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .name }}
      {{- if .optional }}
      optional: true
      {{- end }}
{{- end }}

{{/* A value as the environment spells it: a whole number stays whole (values arrive as float64,
which toString would write as 3.3554432e+07). */}}
{{- define "llmgw.text" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}
{{- printf "%d" (int64 .) }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{/* The gateway's environment: every name is one docs/configuration.md documents (a test checks). */}}
{{- define "llmgw.env" -}}
{{- $secret := include "llmgw.secretName" . -}}
{{- $existing := .Values.secrets.existingSecret -}}
- name: BIND_ADDR
  value: {{ printf "0.0.0.0:%d" (int .Values.containerPort) | quote }}
- name: LLMGW_DATA_DIR
  value: /var/lib/llmgw
- name: SHUTDOWN_GRACE_SECONDS
  value: {{ include "llmgw.text" .Values.shutdown.graceSeconds | quote }}
- name: RATE_LIMIT_BACKEND
  value: {{ .Values.rateLimit.backend | quote }}
{{- if .Values.serviceMonitor.enabled }}
- name: LLMGW_PROMETHEUS
  value: "true"
{{- end }}
{{- if .Values.providersConfig }}
- name: LLMGW_CONFIG
  value: /etc/llmgw/providers.toml
{{- end }}
{{- range $name, $value := .Values.config }}
- name: {{ $name }}
  value: {{ include "llmgw.text" $value | quote }}
{{- end }}
{{ include "llmgw.secretEnv" (dict "name" "DATABASE_URL" "secret" $secret) }}
{{- if or $existing .Values.secrets.adminToken }}
{{ include "llmgw.secretEnv" (dict "name" "LLMGW_ADMIN_TOKEN" "secret" $secret "optional" $existing) }}
{{- end }}
{{- if or $existing .Values.secrets.oidcClientSecret }}
{{ include "llmgw.secretEnv" (dict "name" "OIDC_CLIENT_SECRET" "secret" $secret "optional" $existing) }}
{{- end }}
{{- if eq .Values.rateLimit.backend "redis" }}
{{ include "llmgw.secretEnv" (dict "name" "REDIS_URL" "secret" $secret) }}
{{- end }}
{{- range $name := concat (keys .Values.secrets.providerKeys | sortAlpha) .Values.secrets.providerKeyNames }}
{{ include "llmgw.secretEnv" (dict "name" $name "secret" $secret) }}
{{- end }}
{{- end }}
