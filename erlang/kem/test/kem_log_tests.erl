%%% @doc The one log pipeline: records of the real Python port arrive in an
%%% OTP logger handler with the port's metadata; an invalid level stops the
%%% application at start with a clear reason; a restart is one warning.
-module(kem_log_tests).
-include_lib("eunit/include/eunit.hrl").

%% logger handler callback (this module is the test handler)
-export([log/2]).

-define(BROKEN, <<"@compute @workgroup_size(64) fn main() { let x: u32 = ; }">>).

log_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 60, fun native_stderr_arrives_with_port_metadata/0},
      {timeout, 60, fun kernel_failure_carries_kernel_id/0},
      {timeout, 60, fun restart_is_one_warning_not_a_supervisor_report/0}]}.

invalid_level_is_a_start_error_test_() ->
    {timeout, 60, fun() ->
        ok = application:load(kem),
        ok = application:set_env(kem, log, verbose),
        try
            ?assertMatch({error, {kem, {{bad_config, <<"log: verbose is not a log level", _/binary>>}, _}}},
                         application:ensure_all_started(kem))
        after
            application:unload(kem)
        end
    end}.

start() ->
    Started = kem_test_app:start_with_kernels("kem_log", [{"broken", ?BROKEN}],
                                              [{log, info}, {port_env, [{"KEM_TEST_HOOKS", "1"}]}]),
    ok = logger:add_handler(?MODULE, ?MODULE, #{level => all, config => #{pid => self()}}),
    Started.

stop(Started) ->
    logger:remove_handler(?MODULE),
    kem_test_app:stop_with_kernels(Started).

log(Event, #{config := #{pid := Pid}}) ->
    Pid ! {logged, Event}.

native_stderr_arrives_with_port_metadata() ->
    listen(),
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    ?assertEqual({ok, ok}, kem:call(test_hook, {stdout_noise}, 10000)),
    #{level := Level, meta := Meta} = await(<<"noise written to fd 1">>),
    ?assertEqual(info, Level),
    ?assertMatch(#{kem_port := Port, os_pid := OsPid, python_logger := <<"kem_port.native">>}, Meta),
    ?assert(byte_size(maps:get(adapter, Meta)) > 0).

kernel_failure_carries_kernel_id() ->
    listen(),
    ?assertMatch({error, {shader_error, _}}, kem:execute(<<"broken">>, <<1, 2, 3, 4>>, #{})),
    #{meta := Meta} = await(<<"kernel broken failed: shader_error">>),
    ?assertMatch(#{kernel_id := <<"broken">>, python_logger := <<"kem_port.router">>}, Meta).

restart_is_one_warning_not_a_supervisor_report() ->
    listen(),
    ?assertMatch({error, {timeout, _}}, kem:call(test_hook, {sleep_gpu, 3000}, 1000)),  % 1 s: on the GPU by then, under load too
    ok = kem_test_app:wait_for_service(10000),
    timer:sleep(200),
    Events = drain([]),
    Reports = [E || #{msg := {report, #{label := {supervisor, _}}}} = E <- Events],
    Warnings = [E || #{level := warning} = E <- Events, binary:match(text(E), <<"restarting">>) =/= nomatch],
    ?assertEqual([], Reports),
    ?assertEqual(1, length(Warnings)).

%%% helpers

%% eunit runs each test in its own process: point the handler at it.
listen() ->
    ok = logger:update_handler_config(?MODULE, config, #{pid => self()}),
    flush().

text(#{msg := {Format, Args}}) when is_list(Format) -> unicode:characters_to_binary(io_lib:format(Format, Args));
text(#{msg := {string, S}}) -> iolist_to_binary(S);
text(_) -> <<>>.

await(Text) ->
    receive
        {logged, Event} ->
            case binary:match(text(Event), Text) of
                nomatch -> await(Text);
                _ -> Event
            end
    after 10000 -> error({no_log_record, Text})
    end.

drain(Acc) ->
    receive {logged, E} -> drain([E | Acc]) after 0 -> lists:reverse(Acc) end.

flush() ->
    _ = drain([]),
    ok.
