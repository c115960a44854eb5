"""Chat templates with tools for the tool-calling tests, written for these
tests in the shapes of three tool-call formats (on the demo model's ChatML
tokens): Hermes / Qwen (``<tool_call>{"name", "arguments"}</tool_call>``,
results in ``<tool_response>``), Llama 3.1 (an answer that is
``{"name", "parameters"}`` JSON, results in the ``ipython`` role), and a
template that lists tools but has no call format Ferry can read."""

_SYSTEM = """{%- if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}"""

_TURNS = """{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'tool' %}{{ tool_turn(message) }}
{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{{ message.content }}{% for call in message.tool_calls %}{{ call_text(call) }}{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

HERMES = """{%- macro tool_turn(m) %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% endmacro %}
{%- macro call_text(call) %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endmacro %}
<|im_start|>system
""" + _SYSTEM + """{%- if tools %}You may call functions, described in <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
For each call write <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
{% endif %}<|im_end|>
""" + _TURNS

LLAMA31 = """{%- macro tool_turn(m) %}<|im_start|>ipython
{{ m.content }}<|im_end|>
{% endmacro %}
{%- macro call_text(call) %}{"name": "{{ call.function.name }}", "parameters": {{ call.function.arguments | tojson }}}{% endmacro %}
<|im_start|>system
{% if tools %}Environment: ipython
{% endif %}""" + _SYSTEM + """{%- if tools %}To call a function, answer only with JSON {"name": function name, "parameters": an object of its arguments}. Functions:
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}{% endif %}<|im_end|>
""" + _TURNS

#: Takes tools but says no way to call them that Ferry could read back.
LISTS_TOOLS = """{%- macro tool_turn(m) %}<|im_start|>user
Result: {{ m.content }}<|im_end|>
{% endmacro %}
{%- macro call_text(call) %} (called {{ call.function.name }}){% endmacro %}
<|im_start|>system
""" + _SYSTEM + """{% if tools %}Tools: {% for tool in tools %}{{ tool.function.name }} {% endfor %}{% endif %}<|im_end|>
""" + _TURNS
