// The chat template stored with a model (DIR/chat_template.json): how /v1/chat/completions turns
// a list of messages into one prompt, plus stop strings that end the assistant's turn. A plain
// format string per role ("{content}" is replaced), not Jinja: enough for kiln's models.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kiln/core/status.h"

namespace kiln {

inline constexpr const char* kChatTemplateFile = "chat_template.json";

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

struct ChatTemplate {
  std::string system = "{content}\n\n";
  std::string user = "User: {content}\n";
  std::string assistant = "Assistant: {content}\n";
  std::string generation_prompt = "Assistant:";  // appended after the messages
  std::vector<std::string> stop = {"\nUser:"};   // added to every chat request's stop strings

  // InvalidArgument naming the message with an unknown role.
  Expected<std::string> render(const std::vector<ChatMessage>& messages) const;
  std::string to_json() const;
  static Expected<ChatTemplate> from_json(const std::string& text);
};

// DIR/chat_template.json, or the default template when the file does not exist.
Expected<ChatTemplate> load_chat_template(const std::string& dir);
// Writes DIR/chat_template.json (temporary file + rename).
Status save_chat_template(const std::string& dir, const ChatTemplate& t);

}  // namespace kiln
