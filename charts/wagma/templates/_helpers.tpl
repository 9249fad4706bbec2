{{/*
Names. The full name prefixes every object; it is cut to 40 characters so that the agents' pod
names (<full name>-agent-gpu-<ordinal>), which are the agents' names, stay within 63.
*/}}
{{- define "wagma.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{- define "wagma.fullname" -}}
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

{{- define "wagma.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; "wagma.labels" with (dict "ctx" $ "component" "etcd"). */}}
{{- define "wagma.labels" -}}
helm.sh/chart: {{ include "wagma.chart" .ctx }}
{{ include "wagma.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: wagma
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "wagma.selectorLabels" -}}
app.kubernetes.io/name: {{ include "wagma.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "wagma.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "wagma.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The token Secret: the existing one or the chart's. */}}
{{- define "wagma.tokenSecret" -}}
{{- default (printf "%s-token" (include "wagma.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "wagma.etcdName" -}}
{{- printf "%s-etcd" (include "wagma.fullname" .) }}
{{- end }}

{{- define "wagma.etcdHeadless" -}}
{{- printf "%s-etcd-headless" (include "wagma.fullname" .) }}
{{- end }}

{{/* DNS name of etcd member i: (dict "ctx" $ "i" 0) */}}
{{- define "wagma.etcdMemberHost" -}}
{{- printf "%s-%d.%s.%s.svc.%s" (include "wagma.etcdName" .ctx) (int .i) (include "wagma.etcdHeadless" .ctx) .ctx.Release.Namespace .ctx.Values.clusterDomain }}
{{- end }}

{{/*
The etcd endpoints the coordinators and agents get (--etcd): every member by its stable DNS
name, so the client fails over between them, or the external endpoints.
*/}}
{{- define "wagma.etcdEndpoints" -}}
{{- if .Values.etcd.enabled }}
{{- $eps := list }}
{{- range $i := until (int .Values.etcd.replicas) }}
{{- $eps = append $eps (printf "%s:%d" (include "wagma.etcdMemberHost" (dict "ctx" $ "i" $i)) (int $.Values.etcd.clientPort)) }}
{{- end }}
{{- join "," $eps }}
{{- else }}
{{- join "," .Values.etcd.external.endpoints }}
{{- end }}
{{- end }}

{{/* image reference: (dict "image" .Values.x.image "default" "tag") */}}
{{- define "wagma.image" -}}
{{- printf "%s:%s" .image.repository (default .default .image.tag) }}
{{- end }}

{{- define "wagma.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Soft or hard pod anti-affinity over nodes: (dict "ctx" $ "component" "coordinator" "mode" "soft") */}}
{{- define "wagma.antiAffinity" -}}
{{- if eq .mode "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "wagma.selectorLabels" . | nindent 10 }}
{{- else if eq .mode "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "wagma.selectorLabels" . | nindent 12 }}
{{- end }}
{{- end }}

{{/*
etcd client security of the coordinators and agents (etcd.client): the flags, the mounts and the
volumes. The TLS files come from an existing Secret, the password from a Secret mounted as a file.
*/}}
{{- define "wagma.etcdPasswordSecret" -}}
{{- .Values.etcd.client.existingSecret | default (printf "%s-etcd-client" (include "wagma.fullname" .)) }}
{{- end }}

{{- define "wagma.etcdTLSSecret" -}}
{{- .Values.etcd.client.tls.secret | default (printf "%s-etcd-tls" (include "wagma.fullname" .)) }}
{{- end }}

{{/* Whether a client pair is mounted: an existing Secret with certKey, or the chart's with cert. */}}
{{- define "wagma.etcdClientPair" -}}
{{- $t := .Values.etcd.client.tls }}
{{- if and $t.certKey (or $t.secret $t.cert) }}true{{ end }}
{{- end }}

{{- define "wagma.etcdClientArgs" -}}
{{- $c := .Values.etcd.client }}
{{- if $c.tls.enabled }}
- --etcd-cacert
- /etc/wagma/etcd-tls/{{ $c.tls.caKey }}
{{- if include "wagma.etcdClientPair" . }}
- --etcd-cert
- /etc/wagma/etcd-tls/{{ $c.tls.certKey }}
- --etcd-key
- /etc/wagma/etcd-tls/{{ $c.tls.keyKey }}
{{- end }}
{{- end }}
{{- if $c.username }}
- --etcd-user
- {{ $c.username | quote }}
- --etcd-password-file
- /etc/wagma/etcd-password/{{ $c.existingSecretKey }}
{{- end }}
{{- end }}

{{- define "wagma.etcdClientVolumeMounts" -}}
{{- $c := .Values.etcd.client }}
{{- if $c.tls.enabled }}
- name: etcd-tls
  mountPath: /etc/wagma/etcd-tls
  readOnly: true
{{- end }}
{{- if $c.username }}
- name: etcd-password
  mountPath: /etc/wagma/etcd-password
  readOnly: true
{{- end }}
{{- end }}

{{- define "wagma.etcdClientVolumes" -}}
{{- $c := .Values.etcd.client }}
{{- if $c.tls.enabled }}
- name: etcd-tls
  secret:
    secretName: {{ include "wagma.etcdTLSSecret" . }}
    defaultMode: 288 # 0440: the owner and fsGroup read it
{{- end }}
{{- if $c.username }}
- name: etcd-password
  secret:
    secretName: {{ include "wagma.etcdPasswordSecret" . }}
    defaultMode: 288
    items:
      - key: {{ $c.existingSecretKey }}
        path: {{ $c.existingSecretKey }}
{{- end }}
{{- end }}
