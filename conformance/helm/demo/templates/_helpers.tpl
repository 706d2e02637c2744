{{- define "demo.fullname" -}}
{{- printf "%s-demo" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "demo.labels" -}}
app.kubernetes.io/name: demo
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
