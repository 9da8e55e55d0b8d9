{#- saltgate.keepalived: the optional two-node VIP. keepalived moves the addresses in
    `saltgate:keepalived:vips`; its track_script is `saltgate ctl ready`, so a node whose saltgate
    is not ready (stopped, no master UP) gives the VIP to the other. Does nothing without vips. -#}
{%- set root = tpldir.split('/')[0] %}
{%- from root ~ "/map.jinja" import saltgate with context %}
{%- set ka = saltgate.keepalived %}

{%- if ka.vips %}

include:
  - {{ root }}.service

saltgate-keepalived-package-installed:
  pkg.installed:
    - name: {{ ka.pkg }}

saltgate-keepalived-config-file-managed:
  file.managed:
    - name: {{ ka.config_file }}
    - source: salt://{{ root }}/files/keepalived.conf.jinja
    - template: jinja
    - context:
        ka: {{ ka | json }}
        node: {{ grains['id'] | json }}
    - user: root
    - group: root
    - mode: '0640'
    - makedirs: True
    - check_cmd: {{ ka.check_cmd }}
    - require:
      - pkg: saltgate-keepalived-package-installed

saltgate-keepalived-service-running:
  service.running:
    - name: {{ ka.service }}
    - enable: True
    - reload: True
    - require:
      - service: saltgate-service-running
    - watch:
      - file: saltgate-keepalived-config-file-managed

{%- else %}

saltgate-keepalived-not-configured:
  test.succeed_without_changes:
    - name: 'saltgate:keepalived:vips is empty: no VIP managed'

{%- endif %}
