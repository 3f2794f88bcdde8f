{{/* Names are the release name plus the component, cut to 63 characters (a DNS label). */}}
{{- define "brink.name" -}}
{{- printf "%s-%s" .root.Release.Name .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "brink.labels" -}}
app.kubernetes.io/name: {{ printf "brink-%s" .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/part-of: brink
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* The labels a component's Pods are selected by (never change them: selectors are immutable). */}}
{{- define "brink.selector" -}}
app.kubernetes.io/name: {{ printf "brink-%s" .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "brink.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "brink.serviceAccount" -}}
{{- include "brink.name" . -}}
{{- end -}}

{{/* OTEL_* variables, when an endpoint is set. */}}
{{- define "brink.otelEnv" -}}
{{- if .Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otel.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .Values.otel.protocol | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "k8s.cluster.name=%s" .Values.cluster | quote }}
{{- end }}
{{- end -}}

{{/* The Secret name of the replicas' API keys. */}}
{{- define "brink.apiKeysSecret" -}}
{{- .Values.replicas.apiKeys.existingSecret | default (printf "%s-api-keys" .Release.Name | trunc 63 | trimSuffix "-") -}}
{{- end -}}
