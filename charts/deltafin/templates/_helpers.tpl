{{/* Chart name. */}}
{{- define "deltafin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified name of the operator objects. */}}
{{- define "deltafin.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "deltafin.name" .) .Release.Name }}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s-operator" .Release.Name (include "deltafin.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Selector labels (immutable). */}}
{{- define "deltafin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "deltafin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Recommended labels of every chart object. */}}
{{- define "deltafin.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "deltafin.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: deltafin
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Name of the operator's ServiceAccount. */}}
{{- define "deltafin.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "deltafin.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference from {repository, tag, digest} with a default tag. */}}
{{- define "deltafin.image" -}}
{{- $img := index . 0 }}{{- $defaultTag := index . 1 }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default $defaultTag $img.tag) }}
{{- end }}
{{- end }}

{{/* Namespace of the optional DeltafinModel. */}}
{{- define "deltafin.modelNamespace" -}}
{{- default .Release.Namespace .Values.model.namespace }}
{{- end }}
