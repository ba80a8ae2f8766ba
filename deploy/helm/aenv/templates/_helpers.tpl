{{/* The chart's name: app.kubernetes.io/name of every object. */}}
{{- define "aenv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object's name: the release name when it already holds the
chart's name (release "aenv" gives aenv-node, aenv-gateway, ...), else
<release>-<name>. Short enough for the longest suffix within 63 characters.
*/}}
{{- define "aenv.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := include "aenv.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "aenv.labels" -}}
app.kubernetes.io/name: {{ include "aenv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: aenv
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Labels of a component's objects; call with (list $ "node"). */}}
{{- define "aenv.componentLabels" -}}
{{ include "aenv.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* The selector of a component's pods; call with (list $ "node"). */}}
{{- define "aenv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "aenv.name" (index . 0) }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "aenv.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (required "image.tag or image.digest must be set" .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Secret holding the database DSN, and its key. */}}
{{- define "aenv.databaseSecret" -}}
{{- if .Values.database.url }}
{{- include "aenv.fullname" . }}-database
{{- else }}
{{- required "set database.existingSecret (a Secret you create) or database.url" .Values.database.existingSecret }}
{{- end }}
{{- end }}
{{- define "aenv.databaseKey" -}}
{{- if .Values.database.url }}url{{ else }}{{ .Values.database.secretKey }}{{ end }}
{{- end }}

{{/* The Secret holding the secrets key, and its key. */}}
{{- define "aenv.secretsKeySecret" -}}
{{- if .Values.secretsKey.key }}
{{- include "aenv.fullname" . }}-secrets-key
{{- else }}
{{- required "set secretsKey.existingSecret (a Secret you create) or secretsKey.key" .Values.secretsKey.existingSecret }}
{{- end }}
{{- end }}
{{- define "aenv.secretsKeyKey" -}}
{{- if .Values.secretsKey.key }}key{{ else }}{{ .Values.secretsKey.secretKey }}{{ end }}
{{- end }}

{{/* The ingress's API host. */}}
{{- define "aenv.apiHost" -}}
{{- default .Values.domain .Values.ingress.host }}
{{- end }}
