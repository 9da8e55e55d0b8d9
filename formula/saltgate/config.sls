{#- saltgate.config: renders the configuration file from the pillar mapping `saltgate:config`.
    The candidate file is checked with `saltgate check-config` first (check_cmd): a pillar that
    makes an invalid configuration fails this state and leaves the old file, which the running
    service keeps using. -#}
{%- set root = tpldir.split('/')[0] %}
{%- from root ~ "/map.jinja" import saltgate with context %}

include:
  - {{ root }}

{%- if not saltgate.config %}

saltgate-config-pillar-missing:
  test.fail_without_changes:
    - name: 'the pillar saltgate:config is empty: write the saltgate.yaml mapping there (pillar.example)'

{%- else %}
{%- set header = "# Managed by Salt (saltgate formula, from the pillar saltgate:config): local edits are overwritten.\n" %}

saltgate-config-file-managed:
  file.managed:
    - name: {{ saltgate.config_file }}
    - contents: {{ (header ~ (saltgate.config | yaml(False))) | json }}
    - user: {{ saltgate.user }}
    - group: {{ saltgate.group }}
    - mode: '{{ saltgate.mode }}'
    - check_cmd: {{ saltgate.check_cmd }}
    - tmp_ext: .yaml
    - require:
      - pkg: saltgate-package-installed
{%- endif %}
