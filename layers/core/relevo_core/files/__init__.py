"""Files on the machine a tool runs on (the agent, the CLI, the local stack): the ones only the agent
may read (`private`), the stack file every tool finds its stack by (`stack`), and the ones people
write, with their mistakes worded (`user_written`). No Lambda function reads any of them."""
