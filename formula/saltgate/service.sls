{#- saltgate.service: the service runs, starts at boot, and reloads (check-config, then SIGHUP:
    no session is dropped) when the configuration file changes. -#}
{%- set root = tpldir.split('/')[0] %}
{%- from root ~ "/map.jinja" import saltgate with context %}

include:
  - {{ root }}.config

saltgate-service-running:
  service.running:
    - name: {{ saltgate.service.name }}
    - enable: True
    - reload: True
    - require:
      - pkg: saltgate-package-installed
    - watch:
      - file: saltgate-config-file-managed
