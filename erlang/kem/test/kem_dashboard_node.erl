%%% @doc A node-shaped HTTP front for tests: inets httpd on 127.0.0.1
%%% serves `GET|POST /~kem@1.0/KEY' with `dev_kem:KEY/3', the reply sent as
%%% HyperBEAM's httpsig road sends it (hb_http:reply/5): `status' the status
%%% line, every other top-level key a header, `body' the body. A request's
%%% body and content-type are the message's `body' and `content-type'.
%%%
%%% Used by `kem_dashboard_tests' (httpc) and by the browser test
%%% `tests/test_dashboard_browser.py', which compiles this module with erlc
%%% and runs `serve/2' in a real `erl'.
-module(kem_dashboard_node).
-include_lib("inets/include/httpd.hrl").

-export([start/0, stop/1, serve/2, do/1]).

-define(PREFIX, "/~kem@1.0/").

%% @doc An httpd on a free loopback port: `{Httpd, Port, Dir}'.
-spec start() -> {pid(), inet:port_number(), file:filename()}.
start() ->
    {ok, _} = application:ensure_all_started(inets),
    Dir = filename:join("/tmp", "kem_dashboard_node_" ++ os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive]))),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    {ok, Httpd} = inets:start(httpd, [{port, 0}, {bind_address, {127, 0, 0, 1}}, {server_name, "kem"},
                                      {server_root, Dir}, {document_root, Dir}, {modules, [?MODULE]}]),
    [{port, Port}] = httpd:info(Httpd, [port]),
    {Httpd, Port, Dir}.

-spec stop({pid(), inet:port_number(), file:filename()}) -> ok.
stop({Httpd, _Port, Dir}) ->
    inets:stop(httpd, Httpd),
    file:del_dir_r(Dir),
    ok.

%% @doc For the browser test: start kem and the front, write the port
%% number to PortFile, serve until the VM is stopped. With `hostile' in
%% Flags, a call of a kernel whose id is markup is recorded first: no call
%% through kem carries such an id to the figures (the port refuses it, and
%% only a kernel's successful call takes a place), so the page's escaping
%% is tested by giving the recorder the string itself.
-spec serve(file:filename(), [hostile]) -> no_return().
serve(PortFile, Flags) ->
    {ok, _} = application:ensure_all_started(kem),
    lists:member(hostile, Flags) andalso
        kem_dashboard_stats:call_done(hostile_id(), {ok, <<>>}, 1500),
    {_, Port, _} = start(),
    ok = file:write_file(PortFile, integer_to_list(Port)),
    receive stop -> halt(0) end.

hostile_id() ->
    <<"<img src=x onerror=\"document.title='pwned'\"></script>">>.

%% @private httpd's callback.
do(#mod{method = Method, request_uri = Uri, entity_body = Body, parsed_header = Headers}) ->
    Path = hd(string:split(Uri, "?")),
    {Status, Reply} = case Path of
                          ?PREFIX ++ Key when Method =:= "GET"; Method =:= "POST" -> dispatch(Key, Body, Headers);
                          _ -> {404, #{<<"body">> => <<"not found">>}}
                      end,
    Out = maps:get(<<"body">>, Reply, <<>>),
    Sent = [{binary_to_list(K), header_text(V)} || {K, V} <- maps:to_list(Reply),
                                                   K =/= <<"body">>, K =/= <<"status">>],
    {proceed, [{response, {response, [{code, Status}, {content_length, integer_to_list(byte_size(Out))} | Sent],
                           binary_to_list(Out)}}]}.

dispatch(Key, Body, Headers) ->
    #{exports := Keys} = dev_kem:info(#{}),
    case [K || K <- Keys, atom_to_list(K) =:= Key] of
        [Fun] ->
            Msg = maps:from_list([{<<"body">>, list_to_binary(Body)} || Body =/= []] ++
                                 [{<<"content-type">>, list_to_binary(V)} || {"content-type", V} <- Headers]),
            case dev_kem:Fun(#{}, Msg, #{}) of
                {ok, R} -> {maps:get(<<"status">>, R, 200), R};
                {error, R} -> {maps:get(<<"status">>, R, 500), R}
            end;
        [] ->
            {404, #{<<"body">> => <<"no such key">>}}
    end.

header_text(V) when is_integer(V) -> integer_to_list(V);
header_text(V) when is_binary(V) -> binary_to_list(V).
