{{/*
Named templates of the lockstep chart.

Every template here takes the chart's own context (.Values, .Release,
.Chart). A parent chart that has lockstep as a dependency passes
`.Subcharts.lockstep`, so the sidecar it includes is the one this chart
would render (see docs/operations.md, "Your own Deployment").
*/}}

{{- define "lockstep.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lockstep.fullname" -}}
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

{{- define "lockstep.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "lockstep.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "lockstep.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lockstep.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "lockstep.configMapName" -}}
{{- printf "%s-config" (include "lockstep.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lockstep.dashboardName" -}}
{{- printf "%s-dashboard" (include "lockstep.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lockstep.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lockstep.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "true" when the database is the embedded SQLite file, else "". */}}
{{- define "lockstep.sqlite" -}}
{{- if not .Values.database.existingSecret }}true{{ end }}
{{- end }}

{{/* "true" when the SQLite volume is an emptyDir (no claim), else "". */}}
{{- define "lockstep.sqliteEphemeral" -}}
{{- if and (not .Values.persistence.enabled) (not .Values.persistence.existingClaim) }}true{{ end }}
{{- end }}

{{- define "lockstep.sqlitePath" -}}/var/lib/lockstep/lockstep.db{{- end }}

{{/* server.drain_timeout_ms rounded up to whole seconds. */}}
{{- define "lockstep.drainSeconds" -}}
{{- $ms := int64 .Values.config.server.drain_timeout_ms }}
{{- div (add $ms 999) 1000 }}
{{- end }}

{{/* The backend's preStop pause: given, or lockstep's pause + its drain. */}}
{{- define "lockstep.backendPreStopSeconds" -}}
{{- if kindIs "invalid" .Values.backend.preStopSleepSeconds }}
{{- add (int64 .Values.lockstep.preStopSleepSeconds) (include "lockstep.drainSeconds" . | int64) }}
{{- else }}
{{- int64 .Values.backend.preStopSleepSeconds }}
{{- end }}
{{- end }}

{{/* terminationGracePeriodSeconds: given (checked in lockstep.validate), or
     the longer of the two containers' shutdowns plus a 10 s margin. */}}
{{- define "lockstep.gracePeriodSeconds" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- $lockstep := add (int64 .Values.lockstep.preStopSleepSeconds) (include "lockstep.drainSeconds" . | int64) }}
{{- $backend := include "lockstep.backendPreStopSeconds" . | int64 }}
{{- add (max $lockstep $backend) 10 }}
{{- else }}
{{- int64 .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
The checks values.schema.json cannot express (they span several values).
Every message starts with "lockstep chart:"; scripts/chart-check and
tests/chart.rs look for it. The per-value rules of lockstep's own
validation (ranges, enums, patterns) are in values.schema.json; the
cross-field ones of src/config.rs validate() are mirrored here.
*/}}
{{- define "lockstep.validate" -}}
{{- $v := .Values }}
{{- $sqlite := include "lockstep.sqlite" . }}
{{- if and $sqlite (not $v.sidecarOnly) }}
{{- if gt (int64 $v.replicaCount) 1 }}
{{- fail (printf "lockstep chart: SQLite keeps versions and locks in one Pod's file, so replicaCount must be 1 (got %v). For several replicas set database.existingSecret to a Secret holding a PostgreSQL URL." $v.replicaCount) }}
{{- end }}
{{- if $v.autoscaling.enabled }}
{{- fail "lockstep chart: SQLite keeps versions and locks in one Pod's file, so autoscaling cannot be enabled. Set database.existingSecret to a Secret holding a PostgreSQL URL first." }}
{{- end }}
{{- end }}
{{- if and $sqlite (include "lockstep.sqliteEphemeral" .) (not $v.persistence.ephemeral.iUnderstandVersionsResetOnReschedule) }}
{{- fail "lockstep chart: persistence.enabled=false puts the SQLite database on an emptyDir, which is lost with the Pod: every version starts again at 1 when the Pod is replaced or rescheduled, and a client still holding an older ETag overwrites everything written since. Keep persistence.enabled=true (a PersistentVolumeClaim), set persistence.existingClaim, use PostgreSQL (database.existingSecret), or accept the loss with persistence.ephemeral.iUnderstandVersionsResetOnReschedule=true." }}
{{- end }}
{{- $c := $v.config }}
{{- $lease := int64 $c.versioning.write_lease_ms }}
{{- $timeout := int64 $c.upstream.request_timeout_ms }}
{{- $connect := int64 $c.upstream.connect_timeout_ms }}
{{- if ge $connect $timeout }}
{{- fail (printf "lockstep chart: config.upstream.connect_timeout_ms (%d) must be less than config.upstream.request_timeout_ms (%d): a backend that cannot even be connected to within the time a whole request may take is down, and should get its 502 sooner." $connect $timeout) }}
{{- end }}
{{- if le $lease (add $connect $timeout) }}
{{- fail (printf "lockstep chart: config.versioning.write_lease_ms (%d) must be greater than config.upstream.connect_timeout_ms + config.upstream.request_timeout_ms (%d + %d): a write may take that long to reach the backend and be answered, and a write lease that ran out while the backend still works on the write would let a second write race it." $lease $connect $timeout) }}
{{- end }}
{{- $min := int64 $c.locks.min_ttl_ms }}
{{- $max := int64 $c.locks.max_ttl_ms }}
{{- if gt $min $max }}
{{- fail (printf "lockstep chart: config.locks.min_ttl_ms (%d) must be <= config.locks.max_ttl_ms (%d)." $min $max) }}
{{- end }}
{{- if not (kindIs "invalid" $c.locks.default_ttl_ms) }}
{{- $d := int64 $c.locks.default_ttl_ms }}
{{- if or (lt $d $min) (gt $d $max) }}
{{- fail (printf "lockstep chart: config.locks.default_ttl_ms (%d) must lie within [config.locks.min_ttl_ms, config.locks.max_ttl_ms] = [%d, %d]." $d $min $max) }}
{{- end }}
{{- end }}
{{- $ports := list (int64 $v.lockstep.port) (int64 $v.lockstep.adminPort) (int64 $v.backend.port) }}
{{- if ne (len (uniq $ports)) 3 }}
{{- fail (printf "lockstep chart: lockstep.port (%v), lockstep.adminPort (%v) and backend.port (%v) share one Pod network and must differ." $v.lockstep.port $v.lockstep.adminPort $v.backend.port) }}
{{- end }}
{{- $drain := include "lockstep.drainSeconds" . | int64 }}
{{- $preStop := int64 $v.lockstep.preStopSleepSeconds }}
{{- $grace := include "lockstep.gracePeriodSeconds" . | int64 }}
{{- if le $grace (add $preStop $drain) }}
{{- fail (printf "lockstep chart: terminationGracePeriodSeconds (%d) must be greater than lockstep.preStopSleepSeconds (%d) + config.server.drain_timeout_ms in seconds (%d), or in-flight requests are killed mid-drain." $grace $preStop $drain) }}
{{- end }}
{{- $backendPreStop := include "lockstep.backendPreStopSeconds" . | int64 }}
{{- if and (not $v.sidecarOnly) (ge $backendPreStop $grace) }}
{{- fail (printf "lockstep chart: backend.preStopSleepSeconds (%d) must be less than terminationGracePeriodSeconds (%d), or the backend is killed before it gets SIGTERM." $backendPreStop $grace) }}
{{- end }}
{{- if and $v.tls.admin (not $v.tls.existingSecret) }}
{{- fail "lockstep chart: tls.admin needs tls.existingSecret (a kubernetes.io/tls Secret)." }}
{{- end }}
{{- if and $v.tls.adminClientCA.existingSecret (not (and $v.tls.existingSecret $v.tls.admin)) }}
{{- fail "lockstep chart: tls.adminClientCA needs TLS on the admin listener (tls.existingSecret and tls.admin: true): client certificates are asked for in a TLS handshake." }}
{{- end }}
{{- if and $v.config.locks.proxy_prefix (not $v.locks.apiTokens.existingSecret) }}
{{- fail (printf "lockstep chart: config.locks.proxy_prefix (%s) needs locks.apiTokens.existingSecret: without bearer tokens it would hand every client of the public API every lock." $v.config.locks.proxy_prefix) }}
{{- end }}
{{- if and $v.backend.tls.caSecret (not $v.backend.tls.enabled) }}
{{- fail "lockstep chart: backend.tls.caSecret is set but backend.tls.enabled is false." }}
{{- end }}
{{- if $v.sidecarOnly }}
{{- range $key := list "autoscaling" "podDisruptionBudget" "serviceMonitor" "networkPolicy" }}
{{- if (get $v $key).enabled }}
{{- fail (printf "lockstep chart: sidecarOnly renders only the ConfigMap; %s.enabled belongs to the chart that owns the Deployment." $key) }}
{{- end }}
{{- end }}
{{- if and $sqlite $v.persistence.enabled (not $v.persistence.existingClaim) }}
{{- fail "lockstep chart: sidecarOnly renders only the ConfigMap, so it creates no PersistentVolumeClaim for SQLite: set persistence.existingClaim to one of yours." }}
{{- end }}
{{- else }}
{{- if $v.autoscaling.enabled }}
{{- if gt (int64 $v.autoscaling.minReplicas) (int64 $v.autoscaling.maxReplicas) }}
{{- fail (printf "lockstep chart: autoscaling.minReplicas (%v) must be <= autoscaling.maxReplicas (%v)." $v.autoscaling.minReplicas $v.autoscaling.maxReplicas) }}
{{- end }}
{{- range $name, $res := dict "backend" $v.backend.resources "lockstep" $v.lockstep.resources }}
{{- if not (and $res $res.requests $res.requests.cpu) }}
{{- fail (printf "lockstep chart: autoscaling on CPU needs %s.resources.requests.cpu: the autoscaler measures utilisation against the requests of every container in the Pod." $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- $pdb := $v.podDisruptionBudget }}
{{- if and $pdb.enabled (not (kindIs "invalid" $pdb.minAvailable)) (not (kindIs "string" $pdb.minAvailable)) (not $v.autoscaling.enabled) }}
{{- if ge (int64 $pdb.minAvailable) (int64 $v.replicaCount) }}
{{- fail (printf "lockstep chart: podDisruptionBudget.minAvailable (%v) must be less than replicaCount (%v), or no node can ever be drained." $pdb.minAvailable $v.replicaCount) }}
{{- end }}
{{- end }}
{{- if and $v.serviceMonitor.enabled (not $v.service.exposeAdmin) }}
{{- fail "lockstep chart: serviceMonitor scrapes /metrics through the Service's admin port: set service.exposeAdmin to true." }}
{{- end }}
{{- end }}
{{- end }}

{{/* One TOML value: string, boolean, integer or float. Values files give
     every number as a float; whole numbers are written as integers, since
     lockstep's integer keys refuse 25000.0. */}}
{{- define "lockstep.tomlValue" -}}
{{- if kindIs "bool" . }}{{ ternary "true" "false" . }}
{{- else if kindIs "string" . }}{{ toJson . }}
{{- else if kindIs "float64" . }}{{ if eq (floor .) . }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if or (kindIs "int" .) (kindIs "int64" .) }}{{ . }}
{{- else }}{{ fail (printf "lockstep chart: %v (%s) cannot be written to lockstep.toml" . (kindOf .)) }}
{{- end }}
{{- end }}

{{- define "lockstep.listenAddr" -}}
{{- $host := .host }}
{{- if contains ":" $host }}{{ printf "[%s]:%v" $host .port }}{{ else }}{{ printf "%s:%v" $host .port }}{{ end }}
{{- end }}

{{- define "lockstep.upstreamUrl" -}}
{{- $b := .Values.backend }}
{{- if $b.tls.enabled }}
{{- printf "https://%s:%v" $b.tls.host (int64 $b.port) }}
{{- else }}
{{- printf "http://127.0.0.1:%v" (int64 $b.port) }}
{{- end }}
{{- end }}

{{/*
lockstep.toml, from .Values.config. The chart owns the listen addresses,
the upstream URL, the database URL and the TLS file paths; everything else
comes from the values, key by key (values.schema.json allows exactly the
keys of config/lockstep.toml). A null value leaves the key out.
*/}}
{{- define "lockstep.toml" -}}
# lockstep.toml rendered by the lockstep Helm chart from its values.
# Every key is described in config/lockstep.toml of the lockstep repository.
{{- $v := .Values }}
{{- $c := $v.config }}
{{- range $section := list "server" "upstream" "database" "versioning" "locks" "log" }}

[{{ $section }}]
{{- if eq $section "server" }}
listen = {{ include "lockstep.listenAddr" (dict "host" $v.lockstep.bindAddress "port" (int64 $v.lockstep.port)) | quote }}
admin_listen = {{ include "lockstep.listenAddr" (dict "host" $v.lockstep.bindAddress "port" (int64 $v.lockstep.adminPort)) | quote }}
{{- if $v.tls.existingSecret }}
cert_file = "/etc/lockstep/tls/tls.crt"
key_file = "/etc/lockstep/tls/tls.key"
{{- if $v.tls.admin }}
admin_cert_file = "/etc/lockstep/tls/tls.crt"
admin_key_file = "/etc/lockstep/tls/tls.key"
{{- end }}
{{- end }}
{{- if $v.tls.adminClientCA.existingSecret }}
admin_client_ca_file = {{ printf "/etc/lockstep/admin-client-ca/%s" $v.tls.adminClientCA.existingSecretKey | quote }}
{{- end }}
{{- else if and (eq $section "locks") $v.locks.apiTokens.existingSecret }}
api_tokens_file = {{ printf "/etc/lockstep/lock-tokens/%s" $v.locks.apiTokens.existingSecretKey | quote }}
{{- else if eq $section "upstream" }}
url = {{ include "lockstep.upstreamUrl" $ | quote }}
{{- if and $v.backend.tls.enabled $v.backend.tls.caSecret }}
ca_file = {{ printf "/etc/lockstep/upstream-ca/%s" $v.backend.tls.caKey | quote }}
{{- end }}
{{- else if eq $section "database" }}
{{- if include "lockstep.sqlite" $ }}
url = {{ printf "sqlite://%s" (include "lockstep.sqlitePath" $) | quote }}
{{- else }}
# url: LOCKSTEP_DATABASE__URL, from key {{ $v.database.existingSecretKey | quote }} of Secret {{ $v.database.existingSecret | quote }}
{{- end }}
{{- end }}
{{- range $key, $value := (get $c $section) }}
{{- if not (kindIs "invalid" $value) }}
{{ $key }} = {{ include "lockstep.tomlValue" $value }}
{{- end }}
{{- end }}
{{- end }}
{{- range $r := $c.resources }}

[[resources]]
pattern = {{ $r.pattern | toJson }}
{{- if $r.collection }}
collection = {{ $r.collection | toJson }}
{{- end }}
{{- if $r.case_insensitive_ids }}
case_insensitive_ids = true
{{- end }}
{{- if $r.lock }}
lock = {{ $r.lock | toJson }}
{{- end }}
{{- if $r.require_lock }}
require_lock = true
{{- end }}
{{- if $r.detect_drift }}
detect_drift = true
{{- end }}
{{- with $r.drift_ignore }}
drift_ignore = {{ toJson . }}
{{- end }}
{{- if $r.exclusive_writes }}
exclusive_writes = true
{{- end }}
{{- end }}
{{- end }}

{{/* For a pod annotation, so that a config change rolls the Pods. */}}
{{- define "lockstep.configChecksum" -}}
{{- include "lockstep.toml" . | sha256sum }}
{{- end }}

{{/*
The lockstep container, in front of a backend on 127.0.0.1:<backend.port>
of the same Pod. Needs the volumes of "lockstep.volumes" in that Pod.
*/}}
{{- define "lockstep.sidecar" -}}
{{- $v := .Values }}
{{- $adminScheme := ternary "HTTPS" "HTTP" (and (not (empty $v.tls.existingSecret)) $v.tls.admin) -}}
- name: lockstep
  image: {{ printf "%s:%s" $v.lockstep.image.repository (default .Chart.AppVersion $v.lockstep.image.tag) | quote }}
  imagePullPolicy: {{ $v.lockstep.image.pullPolicy }}
  args: ["serve", "--config", "/etc/lockstep/config/lockstep.toml"]
  ports:
    - name: http
      containerPort: {{ $v.lockstep.port }}
      protocol: TCP
    - name: admin
      containerPort: {{ $v.lockstep.adminPort }}
      protocol: TCP
  {{- if or (not (include "lockstep.sqlite" .)) $v.lockstep.env }}
  env:
    {{- if not (include "lockstep.sqlite" .) }}
    - name: LOCKSTEP_DATABASE__URL
      valueFrom:
        secretKeyRef:
          name: {{ $v.database.existingSecret }}
          key: {{ $v.database.existingSecretKey }}
    {{- end }}
    {{- with $v.lockstep.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  {{- /* The kubelet has no client certificate: with mTLS on the admin
       listener the probes can only check that it accepts connections. */}}
  livenessProbe:
    {{- if $v.tls.adminClientCA.existingSecret }}
    tcpSocket:
      port: admin
    {{- else }}
    httpGet:
      path: /healthz
      port: admin
      scheme: {{ $adminScheme }}
    {{- end }}
    {{- with $v.lockstep.livenessProbe }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  readinessProbe:
    {{- if $v.tls.adminClientCA.existingSecret }}
    tcpSocket:
      port: admin
    {{- else }}
    httpGet:
      path: /readyz
      port: admin
      scheme: {{ $adminScheme }}
    {{- end }}
    {{- with $v.lockstep.readinessProbe }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  lifecycle:
    preStop:
      sleep:
        seconds: {{ $v.lockstep.preStopSleepSeconds }}
  {{- with $v.lockstep.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.lockstep.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: lockstep-config
      mountPath: /etc/lockstep/config
      readOnly: true
    - name: lockstep-tmp
      mountPath: /tmp
    {{- if include "lockstep.sqlite" . }}
    - name: lockstep-data
      mountPath: /var/lib/lockstep
    {{- end }}
    {{- if $v.tls.existingSecret }}
    - name: lockstep-tls
      mountPath: /etc/lockstep/tls
      readOnly: true
    {{- end }}
    {{- if $v.backend.tls.caSecret }}
    - name: lockstep-upstream-ca
      mountPath: /etc/lockstep/upstream-ca
      readOnly: true
    {{- end }}
    {{- if $v.tls.adminClientCA.existingSecret }}
    - name: lockstep-admin-client-ca
      mountPath: /etc/lockstep/admin-client-ca
      readOnly: true
    {{- end }}
    {{- if $v.locks.apiTokens.existingSecret }}
    {{- /* The whole Secret, not a subPath: only then does the kubelet
         update the file when the Secret changes. */}}
    - name: lockstep-lock-tokens
      mountPath: /etc/lockstep/lock-tokens
      readOnly: true
    {{- end }}
    {{- with $v.lockstep.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* The Pod volumes the lockstep container mounts. */}}
{{- define "lockstep.volumes" -}}
{{- $v := .Values -}}
- name: lockstep-config
  configMap:
    name: {{ include "lockstep.configMapName" . }}
- name: lockstep-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if include "lockstep.sqlite" . }}
- name: lockstep-data
  {{- if $v.persistence.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ $v.persistence.existingClaim }}
  {{- else if $v.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ printf "%s-data" (include "lockstep.fullname" .) }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- end }}
{{- if $v.tls.existingSecret }}
- name: lockstep-tls
  secret:
    secretName: {{ $v.tls.existingSecret }}
    defaultMode: 0444
{{- end }}
{{- if $v.backend.tls.caSecret }}
- name: lockstep-upstream-ca
  secret:
    secretName: {{ $v.backend.tls.caSecret }}
    defaultMode: 0444
{{- end }}
{{- if $v.tls.adminClientCA.existingSecret }}
- name: lockstep-admin-client-ca
  secret:
    secretName: {{ $v.tls.adminClientCA.existingSecret }}
    defaultMode: 0444
{{- end }}
{{- if $v.locks.apiTokens.existingSecret }}
- name: lockstep-lock-tokens
  secret:
    secretName: {{ $v.locks.apiTokens.existingSecret }}
    defaultMode: 0444
{{- end }}
{{- end }}
