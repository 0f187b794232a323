{{/* Names, labels and the decisions several templates share. */}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The object name prefix: the release name, or "<release>-<chart>". */}}
{{- define "sluice.fullname" -}}
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

{{- define "sluice.operatorName" -}}
{{- printf "%s-operator" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end }}

{{- define "sluice.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "sluice.operatorLabels" -}}
{{ include "sluice.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* An image reference from {repository, tag, digest}; the tag defaults to appVersion. */}}
{{- define "sluice.image" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{- define "sluice.clusterwide" -}}
{{- if empty .Values.operator.watchNamespaces }}true{{ end }}
{{- end }}

{{- define "sluice.leaseName" -}}
{{- default (include "sluice.fullname" .) .Values.operator.leaderElection.leaseName }}
{{- end }}

{{/* Monitoring extras: on when monitoring.enabled and their own switch are both on. */}}
{{- define "sluice.podMonitorOn" -}}
{{- if and .Values.monitoring.enabled .Values.monitoring.podMonitor.enabled }}true{{ end }}
{{- end }}
{{- define "sluice.prometheusRuleOn" -}}
{{- if and .Values.monitoring.enabled .Values.monitoring.prometheusRule.enabled }}true{{ end }}
{{- end }}
{{- define "sluice.grafanaDashboardOn" -}}
{{- if and .Values.monitoring.enabled .Values.monitoring.grafanaDashboard.enabled }}true{{ end }}
{{- end }}

{{/* SLUICE_POD_MONITORS: off without the PodMonitor rule (no access: never touched nor
watched), never while the chart's own PodMonitor scrapes the pods. */}}
{{- define "sluice.podMonitorsMode" -}}
{{- if not .Values.rbac.podMonitors }}off{{ else if include "sluice.podMonitorOn" . }}never{{ else }}{{ .Values.operator.podMonitors }}{{ end }}
{{- end }}

{{/* SLUICE_INFERENCE_POOLS: off without the InferencePool rule. */}}
{{- define "sluice.inferencePoolsMode" -}}
{{- if .Values.rbac.inferencePools }}auto{{ else }}off{{ end }}
{{- end }}

{{/*
Whether a permission of files/operator-rbac.yaml applies to these settings
(args: dict "root" $ "p" permission). `when` comes from operator/rbac.py:
  always      always;
  namespaces  a namespace list is watched (Kopf resolves namespaces);
  podmonitors rbac.podMonitors (the operator touches PodMonitors where their API exists);
  inferencepools rbac.inferencePools (InferencePools, where their API exists);
  leaderelection operator.leaderElection.enabled (the Lease, in the release namespace).
*/}}
{{- define "sluice.permissionWanted" -}}
{{- $root := .root }}
{{- $p := .p }}
{{- $clusterwide := include "sluice.clusterwide" $root }}
{{- if eq $p.when "always" }}true
{{- else if eq $p.when "namespaces" }}{{ if not $clusterwide }}true{{ end }}
{{- else if eq $p.when "podmonitors" }}{{ if $root.Values.rbac.podMonitors }}true{{ end }}
{{- else if eq $p.when "inferencepools" }}{{ if $root.Values.rbac.inferencePools }}true{{ end }}
{{- else if eq $p.when "leaderelection" }}{{ if $root.Values.operator.leaderElection.enabled }}true{{ end }}
{{- else }}
{{- fail (printf "files/operator-rbac.yaml: unknown `when` %q for %s" $p.when $p.resource) }}
{{- end }}
{{- end }}

{{/*
RBAC rules for the permissions of the given scopes that these settings need
(args: dict "root" $ "scopes" (list "workload" "cluster")). One rule per permission,
with the reason as a comment.
*/}}
{{- define "sluice.rbacRules" -}}
{{- $root := .root }}
{{- $scopes := .scopes }}
{{- $table := $root.Files.Get "files/operator-rbac.yaml" | fromYaml }}
{{- range $table.permissions }}
{{- if and (has .scope $scopes) (include "sluice.permissionWanted" (dict "root" $root "p" .)) }}
  # {{ .why }}
  - apiGroups: [{{ .apiGroup | quote }}]
    resources: [{{ .resource | quote }}]
    verbs: {{ toJson .verbs }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Labels of a monitoring object: the chart's, component=monitoring, then the user's extra
labels (args: list $ extraLabels fixedLabels); fixed labels win, no key appears twice.
*/}}
{{- define "sluice.monitoringLabels" -}}
{{- $root := index . 0 }}
{{- $labels := fromYaml (include "sluice.labels" $root) }}
{{- $_ := set $labels "app.kubernetes.io/component" "monitoring" }}
{{- $labels = mergeOverwrite $labels (deepCopy (index . 1)) (index . 2) }}
{{- toYaml $labels }}
{{- end }}
