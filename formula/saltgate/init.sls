{#- saltgate: installs the package (its unit, default configuration, man page). #}
{%- from tpldir ~ "/map.jinja" import saltgate with context %}

saltgate-package-installed:
  pkg.installed:
    - name: {{ saltgate.pkg.name }}
